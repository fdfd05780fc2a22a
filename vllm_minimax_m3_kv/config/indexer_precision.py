"""MiniMax-M3 KV pool precision: the policy, as one pure function.

The question, for every main KV cache dtype vLLM accepts: will the two caches
of a MiniMax-M3 pool (main K/V and the sparse indexer's K) have one precision?
Facts in (platform, flags, model shape, parallelism), verdict out (the indexer
dtype to run with, or why the two caches cannot share one precision and how to
fix it; or, with the operator's explicit opt-in, a mixed pool that vLLM then
zeroes safely). Nothing here imports vLLM: the live config hook and the offline
``check`` command both gather facts and call :func:`decide`, so they cannot
disagree.

The policy is split where it changes for different reasons: the facts it
reads (:mod:`.pool_facts`), verdicts and fixes (:mod:`.verdicts`), vLLM 0.33's
own gates for "does an fp8 indexer run here", restated over frozen facts
(:mod:`.vllm_gates`, pinned to vLLM by
``tests/config/test_vllm_gate_contract.py``), how a refusal reads and which
fixes it offers (:mod:`.refusals`), and stock vLLM's pool (:mod:`.stock_vllm`).
Here: the pairing rules and :func:`decide`.

Each rule is a named entry in ``FP8_INDEXER_RULES`` (:mod:`.vllm_gates`),
``PAIRING_RULES``, ``DRAFTER_RULES`` or ``SCOPE_RULES``, so the reliability
matrix (``tests/reliability/``) can take any one out and show a configuration
that then fails: none is dead weight.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, replace

from vllm_minimax_m3_kv.config.pool_facts import (
    BF16,
    BF16_INDEXER_DTYPES,
    DRAFT_KV_CACHE_DTYPE_FLAG,
    FP8_E4M3,
    FP8_E4M3_DTYPES,
    INDEXER_KV_DTYPE_FLAG,
    KV_CACHE_DTYPE_FLAG,
    SKIP_LAYERS_FLAG,
    PrecisionFacts,
)
from vllm_minimax_m3_kv.config.refusals import (
    FIRST_LINE_ROOM,
    bf16_fix,
    bf16_indexer_needs,
    bf16_main_flags,
    both_bf16_fix,
    describe_request,
    fp8_fixes,
    is_fp8_indexer,
    kv_origin,
    main_cache_runs_here,
    mixed_fix,
    refusal,
    why_no_fp8_indexer,
)
from vllm_minimax_m3_kv.config.verdicts import (
    Fix,
    Outcome,
    Verdict,
    fixed_facts,
)
from vllm_minimax_m3_kv.config.vllm_gates import (
    NO_FP8_INDEXER_QUESTION,
    Fp8Indexers,
    fp8_indexers,
)
from vllm_minimax_m3_kv.envs import ALLOW_MIXED_ENV


def _fp8_indexer_must_run_here(
    facts: PrecisionFacts, indexers: Fp8Indexers
) -> Verdict | None:
    if not is_fp8_indexer(facts) or not indexers.blocked:
        return None
    return refusal(
        facts,
        "no fp8 indexer can run here",
        *fp8_fixes(facts, indexers, (KV_CACHE_DTYPE_FLAG, "fp8")),
        both_bf16_fix(facts),
        because=why_no_fp8_indexer(indexers),
    )


def _fp8_indexer_needs_e4m3_main(
    facts: PrecisionFacts, indexers: Fp8Indexers
) -> Verdict | None:
    kv = facts.kv_cache_dtype
    if not is_fp8_indexer(facts) or kv in FP8_E4M3_DTYPES:
        return None
    return refusal(
        facts,
        f"the indexer cache would be fp8 e4m3 and the main cache "
        f"{facts.main_cache_precision}",
        Fix("both caches fp8 e4m3", flags=((KV_CACHE_DTYPE_FLAG, "fp8"),)),
        both_bf16_fix(facts),
        mixed_pool=True,
    )


def _indexer_stores_bf16_or_fp8(
    facts: PrecisionFacts, indexers: Fp8Indexers
) -> Verdict | None:
    # MiniMaxM3IndexerCache raises NotImplementedError at model build for
    # anything else (mxfp4, nvfp4): no main cache can match it.
    indexer = facts.indexer_kv_dtype
    if indexer in BF16_INDEXER_DTYPES or is_fp8_indexer(facts):
        return None
    keep_fp8: tuple[Fix, ...] = ()
    if facts.kv_cache_dtype in FP8_E4M3_DTYPES:
        keep_fp8 = fp8_fixes(facts, indexers, (INDEXER_KV_DTYPE_FLAG, "fp8"))
    return refusal(
        facts,
        f"the MiniMax-M3 indexer cache stores only bf16 or fp8 e4m3, not {indexer}",
        *keep_fp8,
        both_bf16_fix(facts),
    )


def _main_cache_matches_an_indexer(
    facts: PrecisionFacts, indexers: Fp8Indexers
) -> Verdict | None:
    main = facts.main_cache_precision
    if main in (BF16, FP8_E4M3):
        return None
    return refusal(
        facts,
        f"the main cache would be {main} and the indexer cache bf16",
        *fp8_fixes(
            facts,
            indexers,
            (KV_CACHE_DTYPE_FLAG, "fp8"),
            (INDEXER_KV_DTYPE_FLAG, "fp8"),
        ),
        both_bf16_fix(facts),
        mixed_fix(facts),
        because="MiniMax-M3 indexers store only bf16 or fp8 e4m3, so no indexer "
        "shares this precision",
        mixed_pool=True,
    )


def _auto_indexer_needs_an_fp8_indexer(
    facts: PrecisionFacts, indexers: Fp8Indexers
) -> Verdict | None:
    if facts.indexer_kv_dtype != "auto" or not indexers.blocked:
        return None
    return refusal(
        facts,
        "the indexer would stay bf16 beside the fp8 main cache",
        *fp8_fixes(facts, indexers),
        bf16_fix(facts, "main cache bf16", *bf16_main_flags(facts)),
        mixed_fix(facts),
        because=why_no_fp8_indexer(indexers),
        mixed_pool=True,
    )


def _explicit_indexer_matches_fp8_main(
    facts: PrecisionFacts, indexers: Fp8Indexers
) -> Verdict | None:
    indexer = facts.indexer_kv_dtype
    if indexer == "auto" or is_fp8_indexer(facts):
        return None
    return refusal(
        facts,
        f"an explicit {indexer} indexer would sit beside the fp8 main cache",
        *fp8_fixes(facts, indexers, (INDEXER_KV_DTYPE_FLAG, "fp8")),
        both_bf16_fix(facts),
        mixed_fix(facts),
        mixed_pool=True,
    )


def _skipped_layers(facts: PrecisionFacts) -> str | None:
    layers = facts.unquantized_dense_layers
    if not layers:
        return None
    return (
        f"{SKIP_LAYERS_FLAG} keeps {facts.layers.describe(layers)} at "
        f"{facts.model_dtype} beside {facts.main_cache_precision} main caches "
        "elsewhere"
    )


def _skipped_layers_keep_one_precision(
    facts: PrecisionFacts, indexers: Fp8Indexers
) -> Verdict | None:
    # vLLM's generic Attention (MiniMax-M3's dense layers) stores a skipped
    # layer's main cache at the model dtype; the rest of the pool is quantized.
    why = _skipped_layers(facts)
    if why is None:
        return None
    keep = (
        "keep every layer's main cache fp8"
        if facts.main_cache_precision == FP8_E4M3
        else f"keep every layer's main cache {facts.main_cache_precision}"
    )
    layers = facts.unquantized_dense_layers
    named = facts.layers.describe(layers)
    because = "vLLM's Attention stores a skipped dense layer's main cache at the "
    because += "model dtype"
    what = f"{SKIP_LAYERS_FLAG} keeps {named} at {facts.model_dtype} beside "
    if len(f"{describe_request(facts)}: {what}") > FIRST_LINE_ROOM:  # many layers
        what = f"{SKIP_LAYERS_FLAG} keeps {len(layers)} layers at "
        what += f"{facts.model_dtype} beside "
        because = f"it names {named}, and {because}"
    return refusal(
        facts,
        what + facts.main_cache_precision,
        # vLLM itself must run this main cache (no fp8 KV cache below SM89).
        Fix(keep, without=(SKIP_LAYERS_FLAG,)) if main_cache_runs_here(facts) else None,
        both_bf16_fix(facts),
        # Every indexer rule passed: the index cache runs as it would uniform.
        mixed_fix(
            facts,
            bf16_indexer=_uniform_indexer(facts).indexer_kv_dtype
            not in FP8_E4M3_DTYPES,
        ),
        because=because,
        mixed_pool=True,
    )


def _drafter_mismatch(facts: PrecisionFacts) -> str | None:
    # The proposer builds the drafter with speculative_config.kv_cache_dtype;
    # its layers share the target's block pool (and its indexer dtype).
    draft = facts.draft_kv_cache_dtype
    if draft is None or facts.draft_cache_precision == facts.main_cache_precision:
        return None
    return (
        f"the MTP drafter would cache {facts.draft_cache_precision} "
        f"beside the target's {facts.main_cache_precision}"
    )


def _drafter_kv_cache_matches_target(
    facts: PrecisionFacts, indexers: Fp8Indexers
) -> Verdict | None:
    why = _drafter_mismatch(facts)
    if why is None:
        return None
    return refusal(
        facts,
        why,
        Fix(
            "the drafter shares the target's KV dtype (with a JSON "
            f'--speculative-config, put "kv_cache_dtype": "{facts.kv_cache_dtype}" '
            "in it instead: a dotted flag after the JSON replaces it)",
            flags=((DRAFT_KV_CACHE_DTYPE_FLAG, facts.kv_cache_dtype),),
        ),
        because=f"speculative_config.kv_cache_dtype={facts.draft_kv_cache_dtype} "
        "is the drafter's own, and its layers share the target's block pool",
        mixed_pool=True,
    )


@dataclass(frozen=True)
class PairingRule:
    """One way the pool's precisions can fail to match, and its fixes."""

    name: str
    check: Callable[[PrecisionFacts, Fp8Indexers], Verdict | None]
    mixed_pool_runs: bool = False
    """The pool would be mixed but can run: the explicit opt-in accepts it."""
    about_index_cache: bool = True
    """Asks about the index cache: moot in a pool that has none."""


PAIRING_RULES: tuple[PairingRule, ...] = (
    PairingRule("fp8_indexer_must_run_here", _fp8_indexer_must_run_here),
    PairingRule("fp8_indexer_needs_e4m3_main", _fp8_indexer_needs_e4m3_main),
    PairingRule("indexer_stores_bf16_or_fp8", _indexer_stores_bf16_or_fp8),
    PairingRule(
        "main_cache_matches_an_indexer",
        _main_cache_matches_an_indexer,
        mixed_pool_runs=True,
    ),
    PairingRule(
        "auto_indexer_needs_an_fp8_indexer",
        _auto_indexer_needs_an_fp8_indexer,
        mixed_pool_runs=True,
    ),
    PairingRule(
        "explicit_indexer_matches_fp8_main",
        _explicit_indexer_matches_fp8_main,
        mixed_pool_runs=True,
    ),
    PairingRule(
        "skipped_layers_keep_one_precision",
        _skipped_layers_keep_one_precision,
        mixed_pool_runs=True,
        about_index_cache=False,
    ),
)
"""Checked in order; the first that objects decides."""


DRAFTER_RULES: tuple[PairingRule, ...] = (
    PairingRule("drafter_kv_cache_matches_target", _drafter_kv_cache_matches_target),
)
"""Checked once the target's own pool is judged: the drafter's layers join it."""


@dataclass(frozen=True)
class ScopeRule:
    """When the index-cache rules apply at all."""

    name: str
    applies: Callable[[PrecisionFacts], bool]


SCOPE_RULES: tuple[ScopeRule, ...] = (
    # vLLM builds an index cache only for layers sparse_attention_freq marks
    # (and the MTP drafter's): a pool without one has no indexer question.
    ScopeRule("pool_has_an_index_cache", lambda facts: facts.layers.has_index_cache),
)


def _with_drafter_matched(facts: PrecisionFacts, verdict: Verdict) -> Verdict:
    """The target's refusal, each fix also giving the drafter the target's dtype."""
    if facts.draft_kv_cache_dtype is None:
        return verdict

    def matched(fix: Fix) -> Fix:
        # A fix that changes the target's KV dtype must move the drafter too
        # (to what the target then stores: the drafter's "auto" is the model
        # dtype, whatever the checkpoint declares).
        fixed = fixed_facts(facts, fix)
        if _drafter_mismatch(fixed) is None:
            return fix
        kv = fixed.kv_cache_dtype
        return replace(fix, flags=(*fix.flags, (DRAFT_KV_CACHE_DTYPE_FLAG, kv)))

    why = _drafter_mismatch(facts)
    refused = verdict.refusal
    if why is not None and refused is not None:
        refused = refused.with_also(why)
    return replace(
        verdict, refusal=refused, fixes=tuple(matched(fix) for fix in verdict.fixes)
    )


def _with_skipped_layers_dropped(facts: PrecisionFacts, verdict: Verdict) -> Verdict:
    """A refusal whose fixes would quantize the main cache also drops the skip
    list that would leave some layers unquantized beside it."""
    if verdict.outcome is not Outcome.ERROR or not facts.layers.skipped_dense:
        return verdict

    def dropped(fix: Fix) -> Fix:
        if ALLOW_MIXED_ENV in fix.env_map:
            return fix
        if not fixed_facts(facts, fix).unquantized_dense_layers:
            return fix
        return replace(fix, without=(*fix.without, SKIP_LAYERS_FLAG))

    refused = verdict.refusal
    why = _skipped_layers(facts)
    # Unless the refusal is itself about the skipped layers.
    if (
        why is not None
        and refused is not None
        and not refused.cannot_run.startswith(SKIP_LAYERS_FLAG)
    ):
        refused = refused.with_also(why)
    return replace(verdict, refusal=refused, fixes=tuple(map(dropped, verdict.fixes)))


def _ignored_skips(facts: PrecisionFacts) -> tuple[str, ...]:
    ignored = facts.layers.skip_ignored
    if not ignored or not facts.main_is_quantized:
        return ()
    stays = "its main cache stays" if len(ignored) == 1 else "their main caches stay"
    return (
        f"MiniMax-M3 sparse attention ignores {SKIP_LAYERS_FLAG} for "
        f"{facts.layers.describe(ignored)}: {stays} {facts.main_cache_precision}.",
    )


def _accept_mixed(facts: PrecisionFacts, refusal: Verdict, indexer: str) -> Verdict:
    """The opt-in's verdict: run mixed, unless the bf16 indexer cannot start."""
    flags, env = (
        bf16_indexer_needs(facts)
        if facts.layers.has_index_cache and indexer not in FP8_E4M3_DTYPES
        else ((), ())
    )
    if flags or env:
        blocked = mixed_fix(facts)
        assert blocked is not None and refusal.refusal is not None
        needs = " ".join([f"{k}={v}" for k, v in env] + [f"{f} {v}" for f, v in flags])
        return replace(
            refusal,
            refusal=replace(refusal.refusal, opt_in_needs=needs),
            fixes=(blocked, *(f for f in refusal.fixes if f != blocked)),
        )
    main = facts.main_cache_precision
    parts = [f"main cache {main}"]
    if facts.unquantized_dense_layers:
        parts.append(
            f"{facts.layers.describe(facts.unquantized_dense_layers)} "
            f"{facts.model_dtype} ({SKIP_LAYERS_FLAG})"
        )
    if facts.layers.has_index_cache:
        parts.append(f"indexer cache {'fp8' if indexer in FP8_E4M3_DTYPES else 'bf16'}")
    cost = (
        ", and the bf16 index keys take twice the bytes of fp8 ones"
        if facts.layers.has_index_cache and indexer not in FP8_E4M3_DTYPES
        else ""
    )
    return Verdict(
        Outcome.MIXED,
        indexer,
        f"mixed KV pool by {ALLOW_MIXED_ENV}=1: {', '.join(parts)} on "
        f"{facts.platform.name}. Every worker and the scheduler zero each newly "
        f"allocated block before use (one device memset per block){cost}",
    )


@functools.lru_cache(maxsize=256)
def decide(facts: PrecisionFacts) -> Verdict:
    """The indexer dtype MiniMax-M3 runs with, or the error that stops it.

    Never changes an explicit indexer dtype: only ``auto`` is resolved. A
    pure function of frozen facts, so remembered: every
    ``create_engine_config()`` of the same command asks it again. (Whoever
    changes the rule tables clears it: ``decide.cache_clear()``.)
    """
    target = _decide_target(replace(facts, draft_kv_cache_dtype=None))
    notes = _ignored_skips(facts)
    if target.outcome is Outcome.ERROR:
        verdict = _with_drafter_matched(facts, target)
        return replace(_with_skipped_layers_dropped(facts, verdict), notes=notes)
    for rule in DRAFTER_RULES:
        verdict = rule.check(facts, NO_FP8_INDEXER_QUESTION)
        if verdict is not None:
            return replace(_with_skipped_layers_dropped(facts, verdict), notes=notes)
    return replace(target, notes=notes)


def _uniform_indexer(facts: PrecisionFacts) -> Verdict:
    """What the index cache runs with once every pairing rule is satisfied."""
    indexer = facts.indexer_kv_dtype
    if not facts.layers.has_index_cache:
        return Verdict(
            Outcome.UNCHANGED,
            indexer,
            "no layer builds an index cache (sparse_attention_freq marks none)",
        )
    if facts.main_cache_precision == BF16 and indexer in BF16_INDEXER_DTYPES:
        return Verdict(Outcome.UNCHANGED, indexer, "both caches bf16")
    runs = fp8_indexers(facts).runs
    if is_fp8_indexer(facts):
        return Verdict(
            Outcome.UNIFORM,
            indexer,
            "both caches fp8 e4m3 as set",
            fp8_indexer=runs or None,
        )
    if indexer == "auto":
        return Verdict(
            Outcome.INHERITED,
            "fp8",
            f"inherited from {kv_origin(facts, in_full=True)}: "
            f"{runs or 'an fp8 indexer'} "
            f"runs on {facts.platform.name}, so both caches share fp8 e4m3 and "
            "vLLM builds no KV block zeroer",
            fp8_indexer=runs or None,
        )
    # Reached only if a pairing rule above is taken out: leave the request be.
    return Verdict(Outcome.UNCHANGED, indexer, "left as requested")


def _decide_target(facts: PrecisionFacts) -> Verdict:
    """The target model's own pool."""
    indexer = facts.indexer_kv_dtype
    in_scope = all(rule.applies(facts) for rule in SCOPE_RULES)
    both_bf16 = facts.main_cache_precision == BF16 and indexer in BF16_INDEXER_DTYPES
    indexers = (
        fp8_indexers(facts) if in_scope and not both_bf16 else NO_FP8_INDEXER_QUESTION
    )
    for rule in PAIRING_RULES:
        if rule.about_index_cache and (both_bf16 or not in_scope):
            continue
        verdict = rule.check(facts, indexers)
        if verdict is None:
            continue
        if rule.mixed_pool_runs and facts.allow_mixed and main_cache_runs_here(facts):
            resolved = (
                _uniform_indexer(facts).indexer_kv_dtype
                if (not rule.about_index_cache)
                else indexer
            )
            return _accept_mixed(facts, verdict, resolved)
        return verdict
    return _uniform_indexer(facts)
