"""vLLM 0.33's own gates for "does an fp8 indexer run here", restated over
frozen facts (vLLM's read the live platform, so they cannot judge another
machine): ``msa_indexer_unsupported_reason``
(``models/minimax_m3/amd/indexer_msa.py``), ``select_indexer_impl_cls``
(``models/minimax_m3/common/indexer.py``) and
``_minimax_m3_aiter_sparse_pa_requested``
(``models/minimax_m3/common/sparse_attention.py``). They change when vLLM
does: ``tests/config/test_vllm_gate_contract.py`` pins each rule to those
functions under simulated MI355X, MI300X and SM100 platforms. Each is a named
entry of ``FP8_INDEXER_RULES``, which the reliability matrix can take out."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from vllm_minimax_m3_kv.config.pool_facts import (
    AITER_ENV,
    INDEXER_CP_FLAG,
    MAX_MODEL_LEN_FLAG,
    MSA_INDEX_HEAD_DIM,
    MSA_MAX_BLOCKS_PER_ROW,
    MSA_SCORE_TYPE,
    MSA_SPARSE_BLOCK_SIZE,
    MSA_TOPK_BLOCKS,
    SHUFFLE_KV_ENV,
    PlatformFacts,
    PrecisionFacts,
)
from vllm_minimax_m3_kv.config.verdicts import (
    AITER_MSA_REQUIREMENT,
    AITER_REQUIREMENT,
    Fix,
)


@dataclass(frozen=True)
class Blocker:
    """Why no fp8 indexer impl would be selected here, and what changes that."""

    reason: str
    fixes: tuple[Fix, ...]


def enable_aiter_fix(platform: PlatformFacts) -> Fix:
    # Only what is not already set: never tell a user to set what they set.
    wanted = (
        (AITER_ENV, platform.aiter_enabled),
        (SHUFFLE_KV_ENV, platform.shuffle_kv_cache_layout),
    )
    return Fix(
        "turn on AITER sparse paged attention and its MSA indexer",
        env=tuple((name, "1") for name, already in wanted if not already),
    )


def indexer_cp_needs_rocm_tp(facts: PrecisionFacts) -> Blocker | None:
    # select_indexer_impl_cls / msa_indexer_cp_enabled: both CP indexers are
    # ROCm kernels that shard the index cache across TP ranks.
    platform = facts.platform
    if not facts.indexer_cp or (
        platform.vendor == "rocm" and facts.tensor_parallel_size > 1
    ):
        return None
    where = (
        f"tensor_parallel_size={facts.tensor_parallel_size}"
        if platform.vendor == "rocm"
        else platform.name
    )
    return Blocker(
        "minimax_m3_indexer_cp shards the indexer across ROCm TP ranks and "
        f"cannot run on {where}",
        (Fix("use the default indexer", flags=((INDEXER_CP_FLAG, "false"),)),),
    )


def _rocm_msa_needs_gfx950(facts: PrecisionFacts) -> Blocker | None:
    # msa_indexer_unsupported_reason checks AITER first; the arch goes first
    # here so gfx942 hears the reason no env variable can change.
    platform = facts.platform
    if platform.vendor != "rocm" or platform.rocm_gfx950:
        return None
    return Blocker(
        "the AITER MSA indexer's fp8 MFMA kernels exist only on gfx950 "
        f"(MI355X/MI350X), and this is {platform.name}",
        (),
    )


def _rocm_msa_needs_aiter_installed(facts: PrecisionFacts) -> Blocker | None:
    # vLLM's AITER switches (@if_aiter_supported) all answer None without it.
    platform = facts.platform
    if platform.vendor != "rocm" or platform.aiter_installed:
        return None
    return Blocker(
        "the AITER MSA indexer needs the aiter package, which is not installed "
        "(or does not support this GPU)",
        (Fix("install aiter", requires=(AITER_REQUIREMENT,)),),
    )


def _rocm_msa_needs_aiter_msa_kernels(facts: PrecisionFacts) -> Blocker | None:
    # The MSA indexer imports them in its CP gate (model build, TP > 1) and
    # in its kernel launches: without them a model builds, then fails a request.
    platform = facts.platform
    if (
        platform.vendor != "rocm"
        or not platform.aiter_installed
        or platform.aiter_msa_kernels
    ):
        return None
    return Blocker(
        "the installed aiter lacks the MSA kernels the AITER MSA indexer imports "
        "(aiter.ops.msa_block_select, aiter.ops.msa_attention)",
        (Fix("update aiter", requires=(AITER_MSA_REQUIREMENT,)),),
    )


def _rocm_msa_needs_aiter_sparse_pa(facts: PrecisionFacts) -> Blocker | None:
    platform = facts.platform
    if platform.vendor != "rocm" or (
        platform.aiter_enabled and platform.shuffle_kv_cache_layout
    ):
        return None
    state = ", ".join(
        f"{name} unset" if name in platform.unset_env else f"{name}={int(value)}"
        for name, value in (
            (AITER_ENV, platform.aiter_enabled),
            (SHUFFLE_KV_ENV, platform.shuffle_kv_cache_layout),
        )
    )
    return Blocker(
        f"the AITER MSA indexer runs only with AITER sparse paged attention ({state})",
        (enable_aiter_fix(platform),),
    )


def _rocm_msa_shape_contract(facts: PrecisionFacts) -> Blocker | None:
    if facts.platform.vendor != "rocm":
        return None
    shape = facts.shape
    contract = (
        ("score_type", shape.score_type, MSA_SCORE_TYPE),
        ("topk_blocks", shape.topk_blocks, MSA_TOPK_BLOCKS),
        ("sparse_block_size", shape.sparse_block_size, MSA_SPARSE_BLOCK_SIZE),
        ("index_head_dim", shape.index_head_dim, MSA_INDEX_HEAD_DIM),
    )
    for name, got, needed in contract:
        if got != needed:
            return Blocker(
                f"the AITER MSA indexer needs {name}={needed!r}, and this "
                f"checkpoint has {name}={got!r}",
                (),
            )
    return None


def _rocm_msa_topk_block_limit(facts: PrecisionFacts) -> Blocker | None:
    if facts.platform.vendor != "rocm":
        return None
    block = facts.shape.sparse_block_size
    blocks = math.ceil(facts.max_model_len / block)
    if blocks <= MSA_MAX_BLOCKS_PER_ROW:
        return None
    return Blocker(
        f"max_model_len={facts.max_model_len} spans {blocks} blocks, more "
        f"than the {MSA_MAX_BLOCKS_PER_ROW} the AITER MSA top-k holds",
        (
            Fix(
                "fit the AITER MSA top-k",
                flags=((MAX_MODEL_LEN_FLAG, str(MSA_MAX_BLOCKS_PER_ROW * block)),),
            ),
        ),
    )


def _needs_fp8_capable_gpu(facts: PrecisionFacts) -> Blocker | None:
    # select_indexer_impl_cls: fp8 needs a CUDA device that supports fp8 (SM89
    # and newer) or, with this plugin, ROCm (its own rules below).
    platform = facts.platform
    if platform.vendor == "rocm" or (
        platform.vendor == "cuda" and platform.cuda_supports_fp8
    ):
        return None
    return Blocker(
        "the fp8 indexer needs a CUDA GPU with fp8 support (or ROCm gfx942 or "
        f"gfx950), and {platform.name} is neither",
        (),
    )


def _rocm_triton_fp8_needs_gfx942_or_gfx950(
    facts: PrecisionFacts,
) -> Blocker | None:
    # The plugin opens vLLM's Triton indexer to fp8 where Triton's fp8 dots
    # are native and its writer is right: gfx950 (e4m3fn, vLLM's fused insert)
    # and gfx942 (e4m3fnuz, the plugin's writer).
    platform = facts.platform
    if platform.vendor != "rocm" or platform.rocm_gfx950 or platform.rocm_gfx942:
        return None
    return Blocker(
        f"{ROCM_TRITON_INDEXER} runs an fp8 index cache only on gfx950 "
        f"(MI355X/MI350X) and gfx942 (MI300X/MI325X), and this is {platform.name}",
        (),
    )


def _rocm_triton_fp8_needs_no_indexer_cp(facts: PrecisionFacts) -> Blocker | None:
    # select_indexer_impl_cls: the context-parallel Triton indexer takes only
    # a bf16 index cache.
    if facts.platform.vendor != "rocm" or not facts.indexer_cp:
        return None
    return Blocker(
        f"{ROCM_TRITON_INDEXER} shards its index cache across TP ranks "
        "(minimax_m3_indexer_cp) only in bf16",
        (Fix("use the default indexer", flags=((INDEXER_CP_FLAG, "false"),)),),
    )


def _rocm_triton_fp8_beside_aiter_sparse_pa(
    facts: PrecisionFacts,
) -> Blocker | None:
    # amd/model.py: beside AITER sparse PA the index key and query are written
    # by AITER's fused_qknorm_idxrqknorm or by vLLM's fused op and its Triton
    # minimax_m3_insert_index_cache (amd/ops/sparse_pa.py, a cast without a
    # clamp; on gfx942 the fused op's OCP store is wrong for fnuz), not by the
    # writer the node self-test vouches for (vLLM's fused op on gfx950, the
    # plugin's fnuz writer on gfx942): the plugin serves no such index cache.
    # (At more than one KV head per rank vLLM's build would fail there too:
    # minimax_m3_use_aiter_sparse_pa serves those only with the MSA indexer.)
    if not facts.platform.aiter_sparse_pa:
        return None
    return Blocker(
        f"beside AITER sparse paged attention {ROCM_TRITON_INDEXER}'s fp8 "
        "index cache would be written by AITER's kernels or vLLM's Triton "
        "insert (no clamp), which nothing here checks (the node self-test "
        "vouches for the writer that runs without it)",
        (
            Fix(
                f"{ROCM_TRITON_INDEXER} without AITER sparse paged attention",
                env=((SHUFFLE_KV_ENV, "0"),),
            ),
        ),
    )


ANY_INDEXER = ""
"""A rule every fp8 indexer on the platform needs."""


ROCM_MSA_INDEXER = "the AITER MSA indexer"


ROCM_TRITON_INDEXER = "vLLM's Triton indexer"
"""On ROCm, with an fp8 index cache, only by this plugin's registry entry
``minimax_m3_rocm_fp8_triton_indexer`` (``patches.py``)."""


@dataclass(frozen=True)
class Rule:
    """One condition an fp8 MiniMax-M3 indexer needs, restating a vLLM gate."""

    name: str
    check: Callable[[PrecisionFacts], Blocker | None]
    indexer: str = ANY_INDEXER
    """The indexer this rule gates (``ANY_INDEXER``: all of them)."""
    once_selected: bool = False
    """Checked only once vLLM has selected the indexer: failing it then stops
    the start instead of letting vLLM fall back to another indexer."""


FP8_INDEXER_RULES: tuple[Rule, ...] = (
    Rule("indexer_cp_needs_rocm_tp", indexer_cp_needs_rocm_tp),
    Rule("needs_fp8_capable_gpu", _needs_fp8_capable_gpu),
    # ROCm: vLLM selects the AITER MSA indexer wherever its contract holds
    # (amd/model.py, _build_sparse_indexer_context), else the neutral one.
    Rule("rocm_msa_needs_gfx950", _rocm_msa_needs_gfx950, ROCM_MSA_INDEXER),
    Rule(
        "rocm_msa_needs_aiter_installed",
        _rocm_msa_needs_aiter_installed,
        ROCM_MSA_INDEXER,
    ),
    Rule(
        "rocm_msa_needs_aiter_sparse_pa",
        _rocm_msa_needs_aiter_sparse_pa,
        ROCM_MSA_INDEXER,
    ),
    Rule("rocm_msa_shape_contract", _rocm_msa_shape_contract, ROCM_MSA_INDEXER),
    Rule("rocm_msa_topk_block_limit", _rocm_msa_topk_block_limit, ROCM_MSA_INDEXER),
    Rule(
        "rocm_msa_needs_aiter_msa_kernels",
        _rocm_msa_needs_aiter_msa_kernels,
        ROCM_MSA_INDEXER,
        once_selected=True,
    ),
    Rule(
        "rocm_triton_fp8_needs_gfx942_or_gfx950",
        _rocm_triton_fp8_needs_gfx942_or_gfx950,
        ROCM_TRITON_INDEXER,
    ),
    Rule(
        "rocm_triton_fp8_needs_no_indexer_cp",
        _rocm_triton_fp8_needs_no_indexer_cp,
        ROCM_TRITON_INDEXER,
    ),
    Rule(
        "rocm_triton_fp8_beside_aiter_sparse_pa",
        _rocm_triton_fp8_beside_aiter_sparse_pa,
        ROCM_TRITON_INDEXER,
    ),
)
"""Every condition, per indexer; :func:`fp8_indexers` says which one runs."""


@dataclass(frozen=True)
class Fp8Indexers:
    """Which fp8 indexer vLLM would select here, or what stops each one."""

    runs: str | None
    """The indexer that runs an fp8 index cache (``ANY_INDEXER`` off ROCm,
    where vLLM's own choice needs no name); None when none can."""
    common: tuple[Blocker, ...] = ()
    """What stops every indexer."""
    candidates: tuple[tuple[str, tuple[Blocker, ...]], ...] = ()
    """Each indexer that could be made to run, with what stops it alone."""

    @property
    def blocked(self) -> bool:
        return self.runs is None

    @property
    def reasons(self) -> tuple[str, ...]:
        """Why none runs: for an indexer that hardware or the checkpoint rules
        out, only that (what a flag could change would not help it)."""
        own = []
        for _, blockers in self.candidates:
            final = [b for b in blockers if not b.fixes]
            own += [b.reason for b in final or blockers]
        return tuple(dict.fromkeys([*(b.reason for b in self.common), *own]))


NO_FP8_INDEXER_QUESTION = Fp8Indexers(runs=ANY_INDEXER)
"""For pools whose index cache needs no fp8 indexer (both caches bf16)."""


def fp8_indexers(facts: PrecisionFacts) -> Fp8Indexers:
    """Which fp8 indexer would run with these facts, as vLLM selects it."""

    def failing(indexer: str, once_selected: bool = False) -> tuple[Blocker, ...]:
        return tuple(
            blocker
            for rule in FP8_INDEXER_RULES
            if rule.indexer == indexer and rule.once_selected == once_selected
            if (blocker := rule.check(facts)) is not None
        )

    common = failing(ANY_INDEXER)
    if facts.platform.vendor != "rocm":
        return Fp8Indexers(
            runs=None if common else ANY_INDEXER,
            common=common,
            candidates=((ANY_INDEXER, ()),) if common else (),
        )
    msa = failing(ROCM_MSA_INDEXER)
    msa_after = failing(ROCM_MSA_INDEXER, once_selected=True)
    if not common and not msa:
        # Selected: vLLM builds it and fails there, with no fallback.
        if msa_after:
            return Fp8Indexers(None, (), ((ROCM_MSA_INDEXER, msa_after),))
        return Fp8Indexers(ROCM_MSA_INDEXER)
    triton = failing(ROCM_TRITON_INDEXER)
    if not common and not triton:
        return Fp8Indexers(ROCM_TRITON_INDEXER)
    return Fp8Indexers(
        None,
        common,
        ((ROCM_TRITON_INDEXER, triton), (ROCM_MSA_INDEXER, msa + msa_after)),
    )
