"""pytest plugin: the simulated accelerator for a whole test run.

``SIM_HARDWARE=mi355x SIM_AITER=msa python -m pytest -p vllm_minimax_m3_kv_sim.plumbing.pytest_hardware``
makes that platform (and, on ROCm, aiter in that state) the current one before
pytest imports any conftest: vLLM's own ``tests/conftest.py`` imports vLLM
(``LLM``, ``vllm.distributed``) at module level, so the platform must be set
first. Test files written for a GPU machine (vLLM's own, in ``upstream/``) then
run here unchanged. Only hardware is stood in for.
"""

from __future__ import annotations

import os

import pytest

from vllm_minimax_m3_kv_sim.hardware import simulate


@pytest.hookimpl(tryfirst=True)
def pytest_load_initial_conftests(
    early_config: object, parser: object, args: object
) -> None:
    # Runs for plugins named with -p, before pytest's own loading of the
    # initial conftests (the hook's later implementation).
    if platform := os.environ.get("SIM_HARDWARE"):
        simulate(platform, os.environ.get("SIM_AITER", "msa"))
        import vllm.model_executor.layers.fused_moe.runner.shared_experts as shared

        # The GPU's side stream for MoE shared experts (a torch.cuda.Stream):
        # this machine has none, and a model built on the meta device never
        # runs on it. As vllm_minimax_m3_kv_sim.engine.build_model does.
        shared.aux_stream = lambda: None
