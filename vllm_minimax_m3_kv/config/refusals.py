"""How a refusal reads (what was asked, where, what cannot run, then why
and the mixed-pool hazard) and the fixes each kind of refusal offers."""

from __future__ import annotations

from vllm_minimax_m3_kv.config.pool_facts import (
    BF16,
    DTYPE_FLAG,
    FP8_E4M3_DTYPES,
    INDEXER_KV_DTYPE_FLAG,
    KV_CACHE_DTYPE_FLAG,
    SHUFFLE_KV_ENV,
    PrecisionFacts,
)
from vllm_minimax_m3_kv.config.verdicts import (
    Fix,
    Outcome,
    Refusal,
    Verdict,
)
from vllm_minimax_m3_kv.config.vllm_gates import (
    ANY_INDEXER,
    Fp8Indexers,
    indexer_cp_needs_rocm_tp,
)
from vllm_minimax_m3_kv.envs import ALLOW_MIXED_ENV


def kv_origin(facts: PrecisionFacts, in_full: bool = False) -> str:
    """Where the main cache dtype came from: a few words, or ``in_full``."""
    if not facts.kv_from_checkpoint:
        return f"{KV_CACHE_DTYPE_FLAG} {facts.kv_cache_dtype}"
    if not in_full:
        return f"the checkpoint's {facts.kv_cache_dtype} KV cache"
    article = "an" if facts.kv_cache_dtype.startswith("fp8") else "a"
    return (
        f"the checkpoint's quantization config declares {article} "
        f"{facts.kv_cache_dtype} KV cache ({facts.kv_cache_source}), which vLLM "
        f"applies to {KV_CACHE_DTYPE_FLAG} auto"
    )


def asked(facts: PrecisionFacts) -> str:
    """What was asked, as a refusal's first line says it."""
    return f"{kv_origin(facts)}, with indexer_kv_dtype={facts.indexer_kv_dtype!r}"


def describe_request(facts: PrecisionFacts) -> str:
    return f"{asked(facts)} on {facts.platform.name}"


def why_no_fp8_indexer(indexers: Fp8Indexers) -> str:
    return "; and ".join(indexers.reasons)


FIRST_LINE_ROOM = 150
"""Characters a refusal's first line leaves for what was asked and what
cannot run (it stays under about 200 with the prefix and a dtype name)."""


def fp8_fixes(
    facts: PrecisionFacts, indexers: Fp8Indexers, *flags: tuple[str, str]
) -> tuple[Fix, ...]:
    """The fixes that give both caches fp8 e4m3, one per indexer this machine
    can be made to run (none where hardware or checkpoint stops them all)."""
    keeps_main = facts.kv_cache_dtype in FP8_E4M3_DTYPES and not any(
        flag == KV_CACHE_DTYPE_FLAG for flag, _ in flags
    )
    summary = (
        "keep the fp8 KV cache, fp8 indexer"
        if keeps_main
        else "fp8 KV cache and fp8 indexer"
    )
    # Where an indexer already runs, the flags alone are the fix.
    candidates = indexers.candidates or ((indexers.runs or ANY_INDEXER, ()),)
    fixable = [
        (name, indexers.common + blockers)
        for name, blockers in candidates
        if all(blocker.fixes for blocker in indexers.common + blockers)
    ]
    fixes = []
    for name, blockers in fixable:
        enabling = [blocker.fixes[0] for blocker in blockers]
        fixes.append(
            Fix(
                f"{summary} ({name})" if name and len(fixable) > 1 else summary,
                flags=tuple(flags) + tuple(f for fix in enabling for f in fix.flags),
                env=tuple(dict(e for fix in enabling for e in fix.env).items()),
                requires=tuple(
                    dict.fromkeys(r for fix in enabling for r in fix.requires)
                ),
            )
        )
    return tuple(fixes)


def bf16_indexer_needs(
    facts: PrecisionFacts,
) -> tuple[tuple[tuple[str, str], ...], tuple[tuple[str, str], ...]]:
    """Flags and env the bf16 indexer needs to start in this config."""
    flags: tuple[tuple[str, str], ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    cp = indexer_cp_needs_rocm_tp(facts)
    if cp is not None:
        flags += cp.fixes[0].flags
    if facts.platform.aiter_sparse_pa and facts.kv_heads_per_rank > 1:
        # minimax_m3_use_aiter_sparse_pa: with more than one KV head per rank
        # AITER sparse PA needs the fp8 (MSA) indexer; bf16 runs without it.
        env = ((SHUFFLE_KV_ENV, "0"),)
    return flags, env


def bf16_fix(facts: PrecisionFacts, summary: str, *flags: tuple[str, str]) -> Fix:
    """A bf16-indexer fallback, with what else it needs on this machine."""
    more_flags, env = bf16_indexer_needs(facts)
    return Fix(summary, flags=flags + more_flags, env=env)


def bf16_main_flags(facts: PrecisionFacts) -> tuple[tuple[str, str], ...]:
    # "auto" stores the model dtype, and vLLM refuses a float KV dtype other
    # than the model's: a non-bf16 model must itself run bf16. Where the
    # checkpoint declares a KV cache, "auto" is that one: an explicit bfloat16
    # is what turns it off (vLLM applies a declared cache only to "auto").
    main = (
        (KV_CACHE_DTYPE_FLAG, "auto" if facts.auto_kv_cache_dtype is None else BF16),
    )
    return main if facts.model_dtype == BF16 else ((DTYPE_FLAG, BF16), *main)


def both_bf16_fix(facts: PrecisionFacts) -> Fix:
    return bf16_fix(
        facts,
        "both caches bf16, stock vLLM",
        *bf16_main_flags(facts),
        (INDEXER_KV_DTYPE_FLAG, "auto"),
    )


def main_cache_runs_here(facts: PrecisionFacts) -> bool:
    """Whether vLLM would run this main cache at all (beside a bf16 indexer)."""
    kv, platform = facts.kv_cache_dtype, facts.platform
    if kv in ("float16", BF16):
        # VllmConfig._reject_mismatched_float_kv_cache: an explicit float KV
        # cache must equal the model dtype.
        return kv == facts.model_dtype
    # TritonAttentionImpl: an fp8 KV cache needs native fp8 (SM89+) on CUDA.
    return not (
        kv.startswith("fp8")
        and platform.vendor == "cuda"
        and not platform.cuda_supports_fp8
    )


def mixed_fix(facts: PrecisionFacts, bf16_indexer: bool = True) -> Fix | None:
    """The explicit opt-in: keep this main cache beside another precision
    (a bf16 indexer, or layers skipped from quantization)."""
    if not main_cache_runs_here(facts):
        return None
    flags, env = (
        bf16_indexer_needs(facts)
        if facts.layers.has_index_cache and bf16_indexer
        else ((), ())
    )
    return Fix(
        "accept a mixed pool: every worker zeroes new blocks",
        flags=flags,
        env=((ALLOW_MIXED_ENV, "1"), *env),
    )


def refusal(
    facts: PrecisionFacts,
    what: str,
    *fixes: Fix | None,
    because: str = "",
    mixed_pool: bool = False,
) -> Verdict:
    """A refusal: first what was asked, where, and what cannot run (one short
    line), then why, then the mixed-pool hazard where the pool would be mixed."""
    return Verdict(
        Outcome.ERROR,
        facts.indexer_kv_dtype,
        fixes=tuple(fix for fix in fixes if fix is not None),
        refusal=Refusal(
            asked=asked(facts),
            where=facts.platform.name,
            cannot_run=what,
            # The first line names it briefly; here where it came from.
            origin=kv_origin(facts, in_full=True) if facts.kv_from_checkpoint else "",
            because=because,
            mixed_pool=mixed_pool,
        ),
    )


def is_fp8_indexer(facts: PrecisionFacts) -> bool:
    return facts.indexer_kv_dtype in FP8_E4M3_DTYPES
