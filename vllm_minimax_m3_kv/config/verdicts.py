"""What the policy answers: an :class:`Outcome`, a :class:`Verdict`, and
each refusal's :class:`Fix` (how it is rendered, and the facts once it is
applied)."""

from __future__ import annotations

import enum
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, replace

from vllm_minimax_m3_kv.config.pool_facts import (
    AITER_ENV,
    DRAFT_KV_CACHE_DTYPE_FLAG,
    DTYPE_FLAG,
    INDEXER_CP_FLAG,
    INDEXER_KV_DTYPE_FLAG,
    KV_CACHE_DTYPE_FLAG,
    MAX_MODEL_LEN_FLAG,
    SHUFFLE_KV_ENV,
    SKIP_LAYERS_FLAG,
    PrecisionFacts,
)
from vllm_minimax_m3_kv.envs import ALLOW_MIXED_ENV, parse_switch


class Outcome(enum.StrEnum):
    """A verdict's kind; its value is how ``check --json`` spells it."""

    UNCHANGED = "unchanged"
    """Both caches bf16: vLLM's behaviour, untouched."""
    INHERITED = "inherited"
    """``auto`` indexer resolved to fp8 from the fp8 KV cache."""
    UNIFORM = "uniform"
    """Both sides already fp8 e4m3 as the user set them."""
    MIXED = "mixed"
    """Two precisions, accepted by the operator's explicit opt-in; every
    worker and the scheduler zero new blocks."""
    ERROR = "error"


# How a rendered fix line's comment lists what no flag sets.
_NOTE_SEPARATOR = "; "
_REMOVES = "remove "
_REMOVES_END = " from the command"
_NEEDS = "needs "


AITER_REQUIREMENT = "a ROCm vLLM image or build that ships aiter"


AITER_MSA_REQUIREMENT = (
    "an aiter with the MSA kernels (aiter.ops.msa_block_select, "
    "aiter.ops.msa_attention), as in the ROCm vLLM 0.33 image"
)


@dataclass(frozen=True)
class Fix:
    """One way out: what to install, then flags and variables to paste."""

    summary: str
    flags: tuple[tuple[str, str], ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    requires: tuple[str, ...] = ()
    """Software no flag can stand in for (e.g. :data:`AITER_REQUIREMENT`)."""
    without: tuple[str, ...] = ()
    """Flags to remove from the command (a list flag cannot be set empty)."""

    def render(self) -> str:
        """One line that pastes into a shell: the variables and flags, then
        what they do (and what else to change) after ``#``."""
        words = [f"{k}={shlex.quote(v)}" for k, v in self.env]
        words += [f"{flag} {shlex.quote(value)}" for flag, value in self.flags]
        notes = [self.summary]
        notes += [f"{_REMOVES}{flag}{_REMOVES_END}" for flag in self.without]
        notes += [f"{_NEEDS}{requirement}" for requirement in self.requires]
        comment = f"# {_NOTE_SEPARATOR.join(notes)}"
        return f"{' '.join(words)}  {comment}" if words else comment

    @property
    def env_map(self) -> Mapping[str, str]:
        return dict(self.env)


MIXED_POOL_HAZARD = (
    "vLLM 0.33 calls such a pool mixed: every worker builds a KV block zeroer "
    "its scheduler never asks to run, so reused blocks reach the attention "
    "kernels as they were (docs/mixed-pools.md)."
)
"""Said once, on its own line, by every refusal whose pool would be mixed."""

OPT_IN_NEEDS = f"{ALLOW_MIXED_ENV}=1 keeps the bf16 indexer, which needs "

POLICY_SPEAKER = "MiniMax-M3 KV precision"


@dataclass(frozen=True)
class Refusal:
    """Why a command cannot start, in parts; :attr:`lines` is how it reads:
    what was asked, where, and what cannot run (one short line), then where
    the KV dtype came from, why, what else is wrong, the mixed-pool hazard,
    and what the explicit opt-in would still need."""

    asked: str
    """The request, e.g. ``--kv-cache-dtype fp8, with indexer_kv_dtype='auto'``."""
    where: str
    """The machine it was asked on (the platform's name)."""
    cannot_run: str
    origin: str = ""
    """Where the main cache dtype came from, in full, if not from a flag."""
    because: str = ""
    also: tuple[str, ...] = ()
    """Other mismatches in the same command (the drafter's, skipped layers)."""
    mixed_pool: bool = False
    """The pool would be mixed: the hazard is said once, after the causes."""
    opt_in_needs: str = ""
    """What ``ALLOW_MIXED=1`` would still need here, as variables and flags."""
    speaker: str = POLICY_SPEAKER
    joiner: str = ": "
    """Between the request and what cannot run on the first line."""

    @property
    def lines(self) -> tuple[str, ...]:
        first = f"{self.speaker}: {self.asked} on {self.where}"
        lines = [f"{first}{self.joiner}{self.cannot_run}."]
        if self.origin:
            lines.append(f"{self.origin[0].upper()}{self.origin[1:]}.")
        if self.because:
            lines.append(f"Because {self.because}.")
        lines += [f"Also, {why}." for why in self.also]
        if self.mixed_pool:
            lines.append(MIXED_POOL_HAZARD)
        # What the opt-in would need stays last, after the hazard it accepts.
        if self.opt_in_needs:
            lines.append(f"{OPT_IN_NEEDS}{self.opt_in_needs} here.")
        return tuple(lines)

    def with_also(self, why: str) -> Refusal:
        """This refusal with another mismatch, which mixes the pool too."""
        return replace(self, also=(*self.also, why), mixed_pool=True)


@dataclass(frozen=True)
class Verdict:
    outcome: Outcome
    indexer_kv_dtype: str
    """The value vLLM should run with; equal to the request unless inherited."""
    summary: str = ""
    """What runs, in a few words (a start's verdict; a refusal has :attr:`refusal`)."""
    fixes: tuple[Fix, ...] = ()
    notes: tuple[str, ...] = ()
    """Warnings that do not stop the start (e.g. a skip request vLLM ignores)."""
    fp8_indexer: str | None = None
    """Which indexer runs the fp8 index cache, where the platform has more
    than one (``ROCM_TRITON_INDEXER`` or ``ROCM_MSA_INDEXER``)."""
    refusal: Refusal | None = None
    """Why it cannot start (``Outcome.ERROR`` only)."""

    @property
    def uniform(self) -> bool:
        return self.outcome in (Outcome.INHERITED, Outcome.UNIFORM)

    @property
    def starts(self) -> bool:
        return self.outcome is not Outcome.ERROR

    @property
    def headline(self) -> str:
        """The verdict in one line: what runs, or what cannot run and where."""
        return self.refusal.lines[0] if self.refusal is not None else self.summary

    @property
    def reason(self) -> str:
        if self.refusal is not None:
            return "\n".join(self.refusal.lines)
        return self.summary

    @property
    def message(self) -> str:
        if not self.fixes:
            return self.reason
        lines = [self.reason, "Fix with one of:"]
        lines += [f"  {fix.render()}" for fix in self.fixes]
        return "\n".join(lines)


def fixed_facts(facts: PrecisionFacts, fix: Fix) -> PrecisionFacts:
    """The facts once ``fix`` is applied (its KV and model dtypes, its skips)."""
    flags = dict(fix.flags)
    layers = facts.layers
    if SKIP_LAYERS_FLAG in fix.without:
        layers = replace(layers, skip_requested=frozenset())
    if KV_CACHE_DTYPE_FLAG not in flags:
        return replace(
            facts, model_dtype=flags.get(DTYPE_FLAG, facts.model_dtype), layers=layers
        )
    flag = flags[KV_CACHE_DTYPE_FLAG]
    kv = facts.resolve_kv_cache_dtype(flag)
    return replace(
        facts,
        kv_cache_dtype=kv,
        kv_cache_flag=flag,
        model_dtype=flags.get(DTYPE_FLAG, facts.model_dtype),
        layers=layers,
    )


def facts_with_fix(facts: PrecisionFacts, fix: Fix) -> PrecisionFacts:
    """The facts of the command once ``fix`` is applied whole: its flags (KV,
    model, indexer and drafter dtypes, indexer CP, context length, skips)
    and its variables (AITER's two and the mixed-pool opt-in)."""
    fixed = fixed_facts(facts, fix)
    flags, env = dict(fix.flags), fix.env_map
    platform = fixed.platform
    if AITER_ENV in env:
        platform = replace(platform, aiter_enabled=env[AITER_ENV] == "1")
    if SHUFFLE_KV_ENV in env:
        platform = replace(platform, shuffle_kv_cache_layout=env[SHUFFLE_KV_ENV] == "1")
    return replace(
        fixed,
        platform=platform,
        indexer_kv_dtype=flags.get(INDEXER_KV_DTYPE_FLAG, fixed.indexer_kv_dtype),
        indexer_cp=flags.get(INDEXER_CP_FLAG, str(fixed.indexer_cp)).lower() == "true",
        max_model_len=int(flags.get(MAX_MODEL_LEN_FLAG, fixed.max_model_len)),
        draft_kv_cache_dtype=flags.get(
            DRAFT_KV_CACHE_DTYPE_FLAG, fixed.draft_kv_cache_dtype
        ),
        allow_mixed=(
            parse_switch(ALLOW_MIXED_ENV, env[ALLOW_MIXED_ENV])
            if ALLOW_MIXED_ENV in env
            else fixed.allow_mixed
        ),
    )
