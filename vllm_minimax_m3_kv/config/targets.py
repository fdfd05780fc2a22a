"""The GPUs ``check`` judges for, and the context in which the live hook
judges for one.

``check`` runs vLLM's own config validation on its CPU platform with the
plugin's hook in it; :func:`judging_for` tells the hook which GPU the verdict
is for (:func:`vllm_minimax_m3_kv.config.facts.live_platform_facts` answers
with that target's facts) and keeps the verdict the hook reached. Outside
``check`` nothing here is consulted.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from vllm_minimax_m3_kv.config.pool_facts import PrecisionFacts
from vllm_minimax_m3_kv.config.verdicts import Verdict

# Hardware the offline check can judge. AITER flags come from the environment.
TARGET_PLATFORMS: dict[str, dict[str, Any]] = {
    "mi355x": {"name": "ROCm gfx950 (MI355X)", "vendor": "rocm", "rocm_gfx950": True},
    "mi350x": {"name": "ROCm gfx950 (MI350X)", "vendor": "rocm", "rocm_gfx950": True},
    "mi325x": {
        "name": "ROCm gfx942 (MI325X)",
        "vendor": "rocm",
        "rocm_gfx942": True,
        "fp8_fnuz": True,
    },
    "mi300x": {
        "name": "ROCm gfx942 (MI300X)",
        "vendor": "rocm",
        "rocm_gfx942": True,
        "fp8_fnuz": True,
    },
    "mi250x": {"name": "ROCm gfx90a (MI250X)", "vendor": "rocm"},
    "b300": {
        "name": "CUDA sm_103 (B300)",
        "vendor": "cuda",
        "cuda_supports_fp8": True,
        "cuda_sm100_family": True,
    },
    "b200": {
        "name": "CUDA sm_100 (B200)",
        "vendor": "cuda",
        "cuda_supports_fp8": True,
        "cuda_sm100_family": True,
    },
    "h200": {"name": "CUDA sm_90 (H200)", "vendor": "cuda", "cuda_supports_fp8": True},
    "h100": {"name": "CUDA sm_90 (H100)", "vendor": "cuda", "cuda_supports_fp8": True},
    "a100": {"name": "CUDA sm_80 (A100)", "vendor": "cuda"},
}
TARGETS = tuple(TARGET_PLATFORMS)
HERE = "here"
"""``check --target here``: this machine's own platform, aiter and vLLM."""


@dataclass
class Judgement:
    """The first verdict the live hook reached while judging for a target."""

    facts: PrecisionFacts | None = None
    verdict: Verdict | None = None


_judging_for: ContextVar[tuple[str, Judgement] | None] = ContextVar(
    "judging_for", default=None
)
"""The target ``check`` judges for (``HERE``: the live platform), and where
the hook records its verdict."""


@contextlib.contextmanager
def judging_for(target: str) -> Iterator[Judgement]:
    """Let the live hook judge for a named target (``check`` runs vLLM's own
    config validation on its CPU platform, and the verdict is for the GPU).
    Yields where the hook records what it decided."""
    judgement = Judgement()
    token = _judging_for.set((target, judgement))
    try:
        yield judgement
    finally:
        _judging_for.reset(token)


def record_judgement(facts: PrecisionFacts, verdict: Verdict) -> None:
    """Called by the live hook; kept only inside :func:`judging_for`."""
    current = _judging_for.get()
    if current is not None and current[1].verdict is None:
        current[1].facts, current[1].verdict = facts, verdict


def judged_target() -> str | None:
    """The target ``check`` is judging for in this context, if any."""
    current = _judging_for.get()
    return None if current is None else current[0]
