"""MiniMax-M3 indexer-cache precision: the policy, as one pure function.

Facts in (platform, flags, model shape, parallelism), verdict out (the indexer
dtype to run with, or why the two caches cannot share one precision and how to
fix it). Nothing here imports vLLM: the live config hook and the offline
``check`` command both gather facts and call :func:`decide`, so they cannot
disagree.

The rules for "does an fp8 indexer exist here" restate vLLM 0.33's own gates,
which read the live platform and so cannot judge another machine:
``msa_indexer_unsupported_reason`` (``models/minimax_m3/amd/indexer_msa.py``),
``select_indexer_impl_cls`` (``models/minimax_m3/common/indexer.py``) and
``_minimax_m3_aiter_sparse_pa_requested``
(``models/minimax_m3/common/sparse_attention.py``).
``tests/config/test_vllm_gate_contract.py`` pins each rule to those functions
under simulated MI355X, MI300X and SM100 platforms.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

# KV cache dtypes whose bytes are fp8 e4m3, the format every fp8 indexer stores.
FP8_E4M3_KV_CACHE_DTYPES = frozenset({"fp8", "fp8_e4m3"})
FP8_INDEXER_DTYPES = frozenset({"fp8", "fp8_e4m3"})
# vLLM resolves "auto" to this for MiniMax-M3 (``resolve_indexer_kv_dtype``).
STOCK_INDEXER_DEFAULT = "bf16"

# Shape contract of the AITER MSA indexer (vLLM 0.33 ``indexer_msa.py``).
MSA_TOPK_BLOCKS = 16
MSA_SPARSE_BLOCK_SIZE = 128
MSA_INDEX_HEAD_DIM = 128
MSA_SCORE_TYPE = "max"
# SLOTS_MAX * WAVE_SIZE: the most blocks one top-k row can span.
MSA_MAX_BLOCKS_PER_ROW = 128 * 64

AITER_ENV = "VLLM_ROCM_USE_AITER"
SHUFFLE_KV_ENV = "VLLM_ROCM_SHUFFLE_KV_CACHE_LAYOUT"
KV_CACHE_DTYPE_FLAG = "--kv-cache-dtype"
INDEXER_KV_DTYPE_FLAG = "--attention-config.indexer_kv_dtype"
INDEXER_CP_FLAG = "--attention-config.minimax_m3_indexer_cp"
MAX_MODEL_LEN_FLAG = "--max-model-len"


@dataclass(frozen=True)
class PlatformFacts:
    """What the policy needs to know about the accelerator and its env."""

    name: str
    """For messages, e.g. ``"ROCm gfx950 (MI355X)"``."""
    vendor: Literal["rocm", "cuda", "other"]
    rocm_gfx950: bool = False
    cuda_supports_fp8: bool = False
    cuda_sm100_family: bool = False
    aiter_enabled: bool = False
    """``VLLM_ROCM_USE_AITER`` as vLLM reads it."""
    shuffle_kv_cache_layout: bool = False
    """``VLLM_ROCM_SHUFFLE_KV_CACHE_LAYOUT`` as vLLM reads it."""

    @property
    def aiter_sparse_pa(self) -> bool:
        return (
            self.vendor == "rocm"
            and self.aiter_enabled
            and self.shuffle_kv_cache_layout
        )


@dataclass(frozen=True)
class SparseShape:
    """The checkpoint's ``sparse_attention_config`` values the kernels care about."""

    topk_blocks: int = MSA_TOPK_BLOCKS
    sparse_block_size: int = MSA_SPARSE_BLOCK_SIZE
    index_head_dim: int = MSA_INDEX_HEAD_DIM
    score_type: str = MSA_SCORE_TYPE


@dataclass(frozen=True)
class PrecisionFacts:
    platform: PlatformFacts
    kv_cache_dtype: str
    """``--kv-cache-dtype`` as given (``auto``, ``bfloat16``, ``fp8``, ...)."""
    indexer_kv_dtype: str
    """``attention_config.indexer_kv_dtype`` as given (``auto`` when unset)."""
    max_model_len: int
    shape: SparseShape = field(default_factory=SparseShape)
    tensor_parallel_size: int = 1
    indexer_cp: bool = False
    """``attention_config.minimax_m3_indexer_cp``."""


class Outcome(enum.Enum):
    UNCHANGED = "unchanged"
    """fp8 on neither side: vLLM's behaviour, untouched."""
    INHERITED = "inherited"
    """``auto`` indexer resolved to fp8 from the fp8 KV cache."""
    UNIFORM = "uniform"
    """Both sides already fp8 e4m3 as the user set them."""
    ERROR = "error"


@dataclass(frozen=True)
class Fix:
    """One way out, as flags and environment variables a user can paste."""

    summary: str
    flags: tuple[tuple[str, str], ...] = ()
    env: tuple[tuple[str, str], ...] = ()

    def render(self) -> str:
        parts = [f"{k}={v}" for k, v in self.env]
        parts += [f"{flag} {value}" for flag, value in self.flags]
        return f"{' '.join(parts)}  ({self.summary})"

    @property
    def env_map(self) -> Mapping[str, str]:
        return dict(self.env)


@dataclass(frozen=True)
class Verdict:
    outcome: Outcome
    indexer_kv_dtype: str
    """The value vLLM should run with; equal to the request unless inherited."""
    reason: str
    fixes: tuple[Fix, ...] = ()

    @property
    def uniform(self) -> bool:
        return self.outcome in (Outcome.INHERITED, Outcome.UNIFORM)

    @property
    def message(self) -> str:
        if not self.fixes:
            return self.reason
        lines = [self.reason, "Fix with one of:"]
        lines += [f"  {fix.render()}" for fix in self.fixes]
        return "\n".join(lines)


@dataclass(frozen=True)
class _Blocker:
    """Why no fp8 indexer impl would be selected here, and what changes that."""

    reason: str
    fixes: tuple[Fix, ...]


def _enable_aiter_fix() -> Fix:
    return Fix(
        "turn on AITER sparse paged attention, the only ROCm fp8 indexer",
        env=((AITER_ENV, "1"), (SHUFFLE_KV_ENV, "1")),
    )


def _fp8_indexer_blocker(facts: PrecisionFacts) -> _Blocker | None:
    """None when this platform and config select an fp8 indexer impl."""
    platform, shape = facts.platform, facts.shape
    if platform.vendor == "rocm":
        # msa_indexer_unsupported_reason's gates. The arch goes first here
        # (vLLM asks about AITER first) so gfx942 hears the reason no env
        # variable can change; either way the verdict is the same.
        if not platform.rocm_gfx950:
            return _Blocker(
                "the AITER MSA indexer's fp8 MFMA kernels exist only on gfx950 "
                f"(MI355X/MI350X), and this is {platform.name}",
                (),
            )
        if not platform.aiter_sparse_pa:
            state = (
                f"{AITER_ENV}={int(platform.aiter_enabled)}, "
                f"{SHUFFLE_KV_ENV}={int(platform.shuffle_kv_cache_layout)}"
            )
            return _Blocker(
                "on ROCm the only fp8 indexer is the AITER MSA indexer, which "
                f"runs only with AITER sparse paged attention ({state})",
                (_enable_aiter_fix(),),
            )
        contract = (
            ("score_type", shape.score_type, MSA_SCORE_TYPE),
            ("topk_blocks", shape.topk_blocks, MSA_TOPK_BLOCKS),
            ("sparse_block_size", shape.sparse_block_size, MSA_SPARSE_BLOCK_SIZE),
            ("index_head_dim", shape.index_head_dim, MSA_INDEX_HEAD_DIM),
        )
        for name, got, needed in contract:
            if got != needed:
                return _Blocker(
                    f"the AITER MSA indexer needs {name}={needed!r}, and this "
                    f"checkpoint has {name}={got!r}",
                    (),
                )
        blocks = math.ceil(facts.max_model_len / shape.sparse_block_size)
        if blocks > MSA_MAX_BLOCKS_PER_ROW:
            longest = MSA_MAX_BLOCKS_PER_ROW * shape.sparse_block_size
            return _Blocker(
                f"max_model_len={facts.max_model_len} spans {blocks} blocks, more "
                f"than the {MSA_MAX_BLOCKS_PER_ROW} the AITER MSA top-k holds",
                (
                    Fix(
                        "fit the AITER MSA top-k",
                        flags=((MAX_MODEL_LEN_FLAG, str(longest)),),
                    ),
                ),
            )
        return None
    if platform.vendor == "cuda":
        # select_indexer_impl_cls: the CP indexer is ROCm-only, and fp8 needs
        # a CUDA device that supports fp8 (SM89 and newer).
        if facts.indexer_cp:
            return _Blocker(
                "minimax_m3_indexer_cp is a ROCm-only indexer and CUDA has no "
                "fp8 variant of it",
                (Fix("use the default indexer", flags=((INDEXER_CP_FLAG, "false"),)),),
            )
        if not platform.cuda_supports_fp8:
            return _Blocker(
                f"the fp8 indexer needs a CUDA GPU with fp8 support, and "
                f"{platform.name} has none",
                (),
            )
        return None
    return _Blocker(f"{platform.name} has no fp8 MiniMax-M3 indexer", ())


def _describe(facts: PrecisionFacts) -> str:
    return (
        f"{KV_CACHE_DTYPE_FLAG} {facts.kv_cache_dtype} with "
        f"indexer_kv_dtype={facts.indexer_kv_dtype!r} on {facts.platform.name}"
    )


def _keep_fp8_kv_fix(blocker: _Blocker | None, *flags: tuple[str, str]) -> Fix | None:
    """The fix that keeps an fp8 main cache, if this machine can run it."""
    if blocker is None:
        return Fix("keep the fp8 KV cache, fp8 indexer", flags=flags)
    env = next((fix.env for fix in blocker.fixes if fix.env), ())
    if env:
        return Fix("keep the fp8 KV cache, fp8 indexer", flags=flags, env=env)
    return None


_MIXED_POOL = (
    "two precisions in one KV block pool make vLLM build a block zeroer that "
    "its scheduler then drops (stale blocks can decode to NaN; pipeline "
    "stages can disagree)"
)
_MAIN_CACHE_BF16 = Fix("main cache bf16", flags=((KV_CACHE_DTYPE_FLAG, "auto"),))
_BOTH_BF16 = Fix(
    "both caches bf16, stock vLLM",
    flags=((KV_CACHE_DTYPE_FLAG, "auto"), (INDEXER_KV_DTYPE_FLAG, "auto")),
)


def _error(facts: PrecisionFacts, why: str, *fixes: Fix | None) -> Verdict:
    return Verdict(
        Outcome.ERROR,
        facts.indexer_kv_dtype,
        f"MiniMax-M3 KV precision: {_describe(facts)}: {why}.",
        tuple(fix for fix in fixes if fix is not None),
    )


def decide(facts: PrecisionFacts) -> Verdict:
    """The indexer dtype MiniMax-M3 runs with, or the error that stops it.

    Never changes an explicit indexer dtype: only ``auto`` is resolved.
    """
    kv, indexer = facts.kv_cache_dtype, facts.indexer_kv_dtype
    kv_is_fp8 = kv.startswith("fp8")
    kv_is_e4m3 = kv in FP8_E4M3_KV_CACHE_DTYPES
    indexer_is_fp8 = indexer in FP8_INDEXER_DTYPES
    if not kv_is_fp8 and not indexer_is_fp8:
        return Verdict(Outcome.UNCHANGED, indexer, "fp8 on neither cache")

    blocker = _fp8_indexer_blocker(facts)
    if indexer_is_fp8:
        if blocker is not None:
            return _error(
                facts,
                f"no fp8 indexer can run here, because {blocker.reason}",
                *blocker.fixes,
                _BOTH_BF16,
            )
        if not kv_is_e4m3:
            return _error(
                facts,
                f"the indexer cache would be fp8 e4m3 and the main cache {kv}; "
                + _MIXED_POOL,
                Fix("both caches fp8 e4m3", flags=((KV_CACHE_DTYPE_FLAG, "fp8"),)),
                Fix("both caches bf16", flags=((INDEXER_KV_DTYPE_FLAG, "auto"),)),
            )
        return Verdict(Outcome.UNIFORM, indexer, "both caches fp8 e4m3 as set")

    # The main cache is fp8 and the indexer is not, or not yet.
    if not kv_is_e4m3:
        return _error(
            facts,
            f"every MiniMax-M3 fp8 indexer stores e4m3, so no indexer can share "
            f"the precision of a {kv} main cache",
            _keep_fp8_kv_fix(
                blocker,
                (KV_CACHE_DTYPE_FLAG, "fp8"),
                (INDEXER_KV_DTYPE_FLAG, "fp8"),
            ),
            _BOTH_BF16,
        )
    if indexer == "auto":
        if blocker is None:
            return Verdict(
                Outcome.INHERITED,
                "fp8",
                f"inherited from {KV_CACHE_DTYPE_FLAG} {kv}: an fp8 indexer runs "
                f"on {facts.platform.name}, so both caches share fp8 e4m3 and "
                "vLLM builds no KV block zeroer",
            )
        return _error(
            facts,
            f"the indexer would stay bf16 beside the fp8 main cache, because "
            f"{blocker.reason}; " + _MIXED_POOL,
            *blocker.fixes,
            _MAIN_CACHE_BF16,
        )
    return _error(
        facts,
        f"an explicit {indexer} indexer beside an fp8 main cache means " + _MIXED_POOL,
        _keep_fp8_kv_fix(blocker, (INDEXER_KV_DTYPE_FLAG, "fp8")),
        _MAIN_CACHE_BF16,
    )
