"""The plugin's own environment variable, parsed as vLLM parses its flags.

Kept apart from the policy so that registering the variable with vLLM at
plugin load (``patches.py``) imports nothing else.
"""

from __future__ import annotations

import os

ALLOW_MIXED_ENV = "VLLM_MINIMAX_M3_KV_ALLOW_MIXED"
"""The operator's explicit opt-in to a mixed pool (fp8 or other main cache
beside a bf16 indexer), which then runs with zeroing on every worker."""

SKIP_SELFTEST_ENV = "VLLM_MINIMAX_M3_KV_SKIP_SELFTEST"
"""Skips the per-process fp8 indexer self-test (``selftest.py``) on an image
already verified."""


def skip_selftest_from_env() -> bool:
    """``VLLM_MINIMAX_M3_KV_SKIP_SELFTEST``, parsed leniently: any value but
    empty or 0 skips."""
    return os.getenv(SKIP_SELFTEST_ENV, "0") not in ("", "0")


FP8_BALANCED_DECODE_ENV = "VLLM_MINIMAX_M3_KV_FP8_BALANCED_DECODE"
"""Offers vLLM's tuned "balanced" decode index scorer to an fp8 index cache on
ROCm (vLLM gives it to bf16 only). Off by default: unmeasured on a GPU."""


def fp8_balanced_decode_from_env() -> bool:
    """``VLLM_MINIMAX_M3_KV_FP8_BALANCED_DECODE``: any value but empty or 0."""
    return os.getenv(FP8_BALANCED_DECODE_ENV, "0") not in ("", "0")


def allow_mixed_from_env() -> bool:
    """``VLLM_MINIMAX_M3_KV_ALLOW_MIXED``, parsed as vLLM parses its own flags.

    Also registered in ``vllm.envs.environment_variables`` (see patches.py),
    so ``vllm.envs`` reads it through this same function.
    """
    value = os.getenv(ALLOW_MIXED_ENV, "0")
    try:
        return bool(int(value))
    except ValueError:
        raise ValueError(
            f"{ALLOW_MIXED_ENV}={value!r} is not an integer: set "
            f"{ALLOW_MIXED_ENV}=1 to accept a mixed MiniMax-M3 KV pool, or unset it."
        ) from None
