"""The plugin's own environment variables, all parsed one way.

Kept apart from the policy so that registering the variables with vLLM at
plugin load (``patches.py``) imports nothing else.

Every switch reads as vLLM's boolean variables do (``1``/``true`` on,
``0``/``false`` off), plus the spellings people type (``yes``/``on``,
``no``/``off``); unset or empty is off. Anything else is an error naming the
variable, so ``...=false`` can never turn a switch on.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

ALLOW_MIXED_ENV = "VLLM_MINIMAX_M3_KV_ALLOW_MIXED"
"""The operator's explicit opt-in to a mixed pool (fp8 or other main cache
beside a bf16 indexer), which then runs with zeroing on every worker."""

SKIP_SELFTEST_ENV = "VLLM_MINIMAX_M3_KV_SKIP_SELFTEST"
"""Skips the per-process fp8 indexer self-test (``selftest.py``) on an image
already verified."""

FP8_BALANCED_DECODE_ENV = "VLLM_MINIMAX_M3_KV_FP8_BALANCED_DECODE"
"""Offers vLLM's tuned "balanced" decode index scorer to an fp8 index cache on
ROCm (vLLM gives it to bf16 only). Off by default: unmeasured on a GPU."""

SWITCH_ON = ("1", "true", "yes", "on")
SWITCH_OFF = ("", "0", "false", "no", "off")


def parse_switch(name: str, value: str | None) -> bool:
    """``value`` of the switch ``name`` (None: unset), or a ValueError that
    says which values it takes."""
    spelled = (value or "").strip().lower()
    if spelled in SWITCH_ON:
        return True
    if spelled in SWITCH_OFF:
        return False
    raise ValueError(
        f"{name}={value!r} is not a switch value (a vllm-minimax-m3-kv "
        f"variable): set {name}=1 to turn it on, {name}=0 to turn it off, "
        "or unset it."
    )


SWITCHES = (ALLOW_MIXED_ENV, SKIP_SELFTEST_ENV, FP8_BALANCED_DECODE_ENV)
"""Every switch; vLLM reads each at start (its environment table), so a value
none of them takes stops ``vllm serve`` whatever the model."""


def switch_problem(environ: Mapping[str, str] | None = None) -> str | None:
    """The error ``vllm serve`` raises for the first switch in ``environ``
    (this process's by default) that holds no switch value, or None."""
    environ = os.environ if environ is None else environ
    for name in SWITCHES:
        try:
            parse_switch(name, environ.get(name))
        except ValueError as error:
            return str(error)
    return None


def switch_from_env(name: str) -> bool:
    return parse_switch(name, os.getenv(name))


def allow_mixed_from_env() -> bool:
    """``VLLM_MINIMAX_M3_KV_ALLOW_MIXED``. Also registered in
    ``vllm.envs.environment_variables`` (see patches.py), so ``vllm.envs``
    reads it through this same function."""
    return switch_from_env(ALLOW_MIXED_ENV)


def skip_selftest_from_env() -> bool:
    """``VLLM_MINIMAX_M3_KV_SKIP_SELFTEST``."""
    return switch_from_env(SKIP_SELFTEST_ENV)


def fp8_balanced_decode_from_env() -> bool:
    """``VLLM_MINIMAX_M3_KV_FP8_BALANCED_DECODE``."""
    return switch_from_env(FP8_BALANCED_DECODE_ENV)
