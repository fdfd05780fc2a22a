"""The harness's simulated nodes: the product's own target simulation
(``check`` asks stock vLLM through it), re-exported for the tests."""

from vllm_minimax_m3_kv.entrypoints.check.target_platform import (
    AITER_STATES,
    PLATFORMS,
    refresh_rocm_env,
    set_aiter,
    simulate,
)

__all__ = ["AITER_STATES", "PLATFORMS", "refresh_rocm_env", "set_aiter", "simulate"]
