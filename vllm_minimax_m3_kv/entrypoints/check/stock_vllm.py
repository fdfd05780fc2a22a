"""What stock vLLM 0.33 refuses, as the plugin-on plan needs it: the bf16
pools vLLM itself fails to build (which the plugin leaves alone and ``check``
still reports), and whether stock could start the command as typed at all
(the capacity baseline). With the plugin off, stock's own build answers
(:mod:`.stock_build`); ``tests/entrypoints/test_stock_agreement.py`` holds
these answers to that build, cell by cell."""

from __future__ import annotations

from vllm_minimax_m3_kv.config.indexer_precision import (
    decide,
)
from vllm_minimax_m3_kv.config.pool_facts import (
    BF16,
    BF16_INDEXER_DTYPES,
    FP8_E4M3_DTYPES,
    KV_CACHE_DTYPE_FLAG,
    PrecisionFacts,
)
from vllm_minimax_m3_kv.config.refusals import (
    asked,
    bf16_fix,
)
from vllm_minimax_m3_kv.config.verdicts import (
    Fix,
    Outcome,
    Refusal,
    Verdict,
    fixed_facts,
)
from vllm_minimax_m3_kv.config.vllm_gates import (
    ROCM_MSA_INDEXER,
    fp8_indexers,
    indexer_cp_needs_rocm_tp,
)

VLLM_CANNOT_BUILD = "vLLM 0.33 fails to build this MiniMax-M3 KV pool at model build"
"""How a bf16 pool vLLM itself cannot build is reported (by ``check``; the live
hook leaves bf16 pools to vLLM, which raises its own error)."""


def bf16_pool_vllm_cannot_build(facts: PrecisionFacts) -> Verdict | None:
    """A pool with both caches bf16 (the plugin leaves it alone) that vLLM
    0.33 fails to build for a reason the rules above model, as an ERROR
    verdict with vLLM's reason and the fixes that build; None otherwise.

    ``check`` promises what ``vllm serve`` does, so it reports these too.
    """
    both_bf16 = (
        facts.main_cache_precision == BF16
        and facts.indexer_kv_dtype in BF16_INDEXER_DTYPES
    )
    if not both_bf16 or not facts.layers.has_index_cache:
        return None
    reasons = _bf16_index_cache_refusals(facts)
    if not reasons:
        return None
    fixes = [bf16_fix(facts, "both caches bf16, as vLLM builds them")]
    fp8 = Fix("fp8 both: an fp8 KV cache", flags=((KV_CACHE_DTYPE_FLAG, "fp8"),))
    if decide(fixed_facts(facts, fp8)).outcome is Outcome.INHERITED:
        fixes.insert(0, fp8)
    return Verdict(
        Outcome.ERROR,
        facts.indexer_kv_dtype,
        fixes=tuple(fixes),
        refusal=Refusal(
            asked=asked(facts),
            where=facts.platform.name,
            cannot_run="both caches bf16",
            because="; and ".join(reasons),
            speaker=VLLM_CANNOT_BUILD,
            joiner=", ",
        ),
    )


def _bf16_index_cache_refusals(facts: PrecisionFacts) -> list[str]:
    """Why vLLM 0.33 fails to build a bf16 index cache here, whatever the
    main cache holds."""
    reasons = []
    cp = indexer_cp_needs_rocm_tp(facts)
    if cp is not None:  # select_indexer_impl_cls raises, whatever the dtype
        reasons.append(cp.reason)
    if facts.platform.aiter_sparse_pa and facts.kv_heads_per_rank > 1:
        # minimax_m3_use_aiter_sparse_pa: "MiniMax M3 AITER sparse paged
        # attention requires num_kv_heads == 1 per tensor-parallel rank".
        reasons.append(
            "AITER sparse paged attention serves more than one KV head per "
            "rank only beside the AITER MSA indexer's page table, which needs "
            f"an fp8 index cache, and tensor_parallel_size="
            f"{facts.tensor_parallel_size} leaves {facts.kv_heads_per_rank}"
        )
    return reasons


def stock_cannot_start(facts: PrecisionFacts) -> str:
    """Why stock vLLM 0.33 (no plugin) refuses the command as typed; "" where
    it starts it. An fp8 index cache runs on stock only through vLLM's own
    fp8 indexer: on ROCm the AITER MSA indexer (its Triton indexer takes
    bf16 only, until this plugin opens it)."""
    if not facts.layers.has_index_cache:
        return ""
    if facts.indexer_kv_dtype in BF16_INDEXER_DTYPES:
        return "; and ".join(_bf16_index_cache_refusals(facts))
    if facts.indexer_kv_dtype not in FP8_E4M3_DTYPES:
        return ""
    indexers = fp8_indexers(facts)
    rocm = facts.platform.vendor == "rocm"
    if indexers.runs is not None and (not rocm or indexers.runs == ROCM_MSA_INDEXER):
        return ""
    if indexers.runs is not None:  # only the plugin's ROCm Triton fp8 path
        why = (
            "the AITER MSA indexer does not run here and vLLM's ROCm Triton "
            "indexer takes a bf16 index cache only"
        )
    else:
        why = "; ".join(indexers.reasons)
    return f"an fp8 index cache needs vLLM's own fp8 indexer: {why}"
