"""The pure policy: table cases and properties over the whole flag space."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from tests.reliability.fix_reader import read_fix_line
from vllm_minimax_m3_kv.config.indexer_precision import decide
from vllm_minimax_m3_kv.config.pool_facts import (
    MSA_MAX_BLOCKS_PER_ROW,
    PlatformFacts,
    PoolLayers,
    PrecisionFacts,
    SparseShape,
)
from vllm_minimax_m3_kv.config.verdicts import (
    MIXED_POOL_HAZARD,
    Fix,
    Outcome,
    facts_with_fix,
    fixed_facts,
)
from vllm_minimax_m3_kv.entrypoints.check.early import vllm_kv_cache_dtypes
from vllm_minimax_m3_kv.entrypoints.check.stock_vllm import bf16_pool_vllm_cannot_build

MI355X = PlatformFacts(
    "ROCm gfx950 (MI355X)",
    "rocm",
    rocm_gfx950=True,
    aiter_enabled=True,
    shuffle_kv_cache_layout=True,
)
MI355X_NO_AITER = dataclasses.replace(
    MI355X, aiter_enabled=False, shuffle_kv_cache_layout=False
)
MI300X = dataclasses.replace(
    MI355X,
    name="ROCm gfx942 (MI300X)",
    rocm_gfx950=False,
    rocm_gfx942=True,
    fp8_fnuz=True,
)
# AITER on, its sparse paged attention off: the plugin's fnuz writer runs.
MI300X_NO_SPA = dataclasses.replace(MI300X, shuffle_kv_cache_layout=False)
# A ROCm GPU with neither gfx950's nor gfx942's fp8: no fp8 indexer runs there.
MI250X = dataclasses.replace(
    MI300X, name="ROCm gfx90a (MI250X)", rocm_gfx942=False, fp8_fnuz=False
)
B300 = PlatformFacts(
    "CUDA sm_103", "cuda", cuda_supports_fp8=True, cuda_sm100_family=True
)
A100 = PlatformFacts("CUDA sm_80", "cuda")
CPU = PlatformFacts("platform 'cpu'", "other")
NO_AITER = dataclasses.replace(MI355X, aiter_installed=False, aiter_msa_kernels=False)
NO_MSA = dataclasses.replace(MI355X, aiter_msa_kernels=False)
PLATFORMS = [
    MI355X,
    MI355X_NO_AITER,
    MI300X,
    MI300X_NO_SPA,
    MI250X,
    B300,
    A100,
    CPU,
    NO_AITER,
    NO_MSA,
]


def _vllm_kv_cache_dtypes() -> list[str]:
    # vLLM's own list, read from its source as check reads it (importing vLLM
    # here would cost every test worker ~17 CPU-s at collection); the early
    # answers test checks the reading equals vLLM's KV_CACHE_DTYPES.
    dtypes = vllm_kv_cache_dtypes()
    assert dtypes, "vLLM's CacheDType could not be read"
    return list(dtypes)


KV_DTYPES = _vllm_kv_cache_dtypes()
INDEXER_DTYPES = ["auto", "bf16", "fp8", "fp8_e4m3", "mxfp4", "nvfp4"]
MIXED_OK = {"allow_mixed": True}


def facts(platform=MI355X, kv="fp8", indexer="auto", **kwargs) -> PrecisionFacts:
    return PrecisionFacts(
        platform=platform,
        kv_cache_dtype=kv,
        indexer_kv_dtype=indexer,
        max_model_len=kwargs.pop("max_model_len", 8192),
        **kwargs,
    )


@pytest.mark.parametrize(
    ("case", "outcome", "indexer"),
    [
        (facts(), Outcome.INHERITED, "fp8"),
        (facts(kv="fp8_e4m3"), Outcome.INHERITED, "fp8"),
        (facts(indexer="fp8"), Outcome.UNIFORM, "fp8"),
        (facts(B300), Outcome.INHERITED, "fp8"),
        # AITER off on gfx950: vLLM's Triton indexer runs fp8 (the plugin's
        # minimax_m3_rocm_fp8_triton_indexer entry).
        (facts(MI355X_NO_AITER), Outcome.INHERITED, "fp8"),
        (facts(MI355X_NO_AITER, tensor_parallel_size=8), Outcome.INHERITED, "fp8"),
        (facts(MI355X_NO_AITER, indexer="fp8"), Outcome.UNIFORM, "fp8"),
        (facts(NO_AITER), Outcome.INHERITED, "fp8"),
        (
            facts(MI355X_NO_AITER, indexer_cp=True, tensor_parallel_size=4),
            Outcome.ERROR,
            "auto",
        ),
        # gfx942: the same Triton indexer on an e4m3fnuz index cache (the
        # plugin's minimax_m3_rocm_fnuz_index_writer entry writes it).
        (facts(MI300X_NO_SPA), Outcome.INHERITED, "fp8"),
        (facts(MI300X_NO_SPA, tensor_parallel_size=8), Outcome.INHERITED, "fp8"),
        (facts(MI300X_NO_SPA, indexer="fp8"), Outcome.UNIFORM, "fp8"),
        # Beside AITER sparse PA, AITER's kernels would write that index
        # cache, which nothing checks: refused, at every TP, explicit fp8 too.
        (facts(MI300X), Outcome.ERROR, "auto"),
        (facts(MI300X, tensor_parallel_size=8), Outcome.ERROR, "auto"),
        (facts(MI300X, indexer="fp8"), Outcome.ERROR, "fp8"),
        (facts(MI250X), Outcome.ERROR, "auto"),
        (facts(A100), Outcome.ERROR, "auto"),
        (facts(CPU), Outcome.ERROR, "auto"),
        (facts(indexer="bf16"), Outcome.ERROR, "bf16"),
        (facts(kv="auto", indexer="fp8"), Outcome.ERROR, "fp8"),
        (facts(kv="fp8_e5m2"), Outcome.ERROR, "auto"),
        # Every other main dtype vLLM accepts: no indexer stores it.
        (facts(kv="int8_per_token_head"), Outcome.ERROR, "auto"),
        (facts(kv="int4_per_token_head", indexer="bf16"), Outcome.ERROR, "bf16"),
        (facts(kv="nvfp4"), Outcome.ERROR, "auto"),
        (facts(kv="float16"), Outcome.ERROR, "auto"),
        (facts(kv="auto", model_dtype="float16"), Outcome.ERROR, "auto"),
        (facts(kv="auto", indexer="mxfp4"), Outcome.ERROR, "mxfp4"),
        (facts(kv="auto"), Outcome.UNCHANGED, "auto"),
        (facts(kv="bfloat16", indexer="bf16"), Outcome.UNCHANGED, "bf16"),
        # The explicit opt-in: mixed pools that can run start mixed...
        (facts(MI250X, **MIXED_OK), Outcome.MIXED, "auto"),
        (
            facts(indexer="bf16", tensor_parallel_size=8, **MIXED_OK),
            Outcome.MIXED,
            "bf16",
        ),
        (facts(kv="int8_per_token_head", **MIXED_OK), Outcome.MIXED, "auto"),
        (facts(MI300X, kv="fp8_e5m2", **MIXED_OK), Outcome.MIXED, "auto"),
        # ...where an fp8 indexer runs, auto still inherits it...
        (facts(**MIXED_OK), Outcome.INHERITED, "fp8"),
        # ...and what cannot run at all stays an error.
        (facts(MI250X, indexer="fp8", **MIXED_OK), Outcome.ERROR, "fp8"),
        (facts(kv="fp8_e5m2", indexer="fp8", **MIXED_OK), Outcome.ERROR, "fp8"),
        (facts(indexer="mxfp4", **MIXED_OK), Outcome.ERROR, "mxfp4"),
        (facts(indexer="bf16", kv_heads_per_rank=4, **MIXED_OK), Outcome.ERROR, "bf16"),
        (facts(kv="float16", **MIXED_OK), Outcome.ERROR, "auto"),
        (facts(A100, **MIXED_OK), Outcome.ERROR, "auto"),  # no fp8 main cache
        (facts(A100, kv="int8_per_token_head", **MIXED_OK), Outcome.MIXED, "auto"),
        (facts(MI300X, kv="bfloat16", indexer="bf16"), Outcome.UNCHANGED, "bf16"),
        (facts(B300, indexer_cp=True), Outcome.ERROR, "auto"),
        # Past the MSA contract beside AITER sparse PA, vLLM's Triton indexer
        # would read what AITER's kernels or vLLM's unclamped Triton insert
        # wrote: refused at any TP (before: inherited fp8 at one KV head).
        (
            facts(max_model_len=MSA_MAX_BLOCKS_PER_ROW * 128 + 1),
            Outcome.ERROR,
            "auto",
        ),
        (facts(shape=SparseShape(topk_blocks=32)), Outcome.ERROR, "auto"),
        (
            facts(shape=SparseShape(topk_blocks=32), kv_heads_per_rank=2),
            Outcome.ERROR,
            "auto",
        ),
        (facts(indexer_cp=True), Outcome.ERROR, "auto"),  # CP at TP 1
        (facts(indexer_cp=True, tensor_parallel_size=4), Outcome.INHERITED, "fp8"),
    ],
)
def test_table(case, outcome, indexer):
    verdict = decide(case)
    assert (verdict.outcome, verdict.indexer_kv_dtype) == (outcome, indexer)
    if outcome is Outcome.ERROR:
        assert verdict.fixes, verdict.message
        assert case.kv_cache_dtype in verdict.message
        assert repr(case.indexer_kv_dtype) in verdict.message


# Indexer CP at TP 4 keeps vLLM's Triton indexer bf16, so only the AITER MSA
# indexer could give these pools fp8.
CP4 = {"indexer_cp": True, "tensor_parallel_size": 4}


def _fix_for(verdict, indexer: str):
    return next(fix for fix in verdict.fixes if indexer in fix.summary)


def test_missing_aiter_is_named_and_never_answered_with_a_variable_already_set():
    # VLLM_ROCM_USE_AITER=1 and the shuffled layout are set; aiter is not there.
    absent = decide(facts(NO_AITER, **CP4))
    assert absent.outcome is Outcome.ERROR
    assert "needs the aiter package, which is not installed" in absent.reason
    msa = _fix_for(absent, "AITER MSA")
    assert msa.requires == ("a ROCm vLLM image or build that ships aiter",)
    assert msa.env == ()  # the variables are set already
    assert "VLLM_ROCM_USE_AITER=1" not in absent.message
    triton = _fix_for(absent, "Triton")
    assert triton.flags == (("--attention-config.minimax_m3_indexer_cp", "false"),)
    assert not triton.requires  # vLLM's Triton indexer needs no aiter
    # With the variables unset too, the AITER fix needs both.
    unset = decide(
        facts(
            dataclasses.replace(
                NO_AITER, aiter_enabled=False, shuffle_kv_cache_layout=False
            ),
            **CP4,
        )
    )
    unset_msa = _fix_for(unset, "AITER MSA")
    assert unset_msa.requires and dict(unset_msa.env) == {
        "VLLM_ROCM_USE_AITER": "1",
        "VLLM_ROCM_SHUFFLE_KV_CACHE_LAYOUT": "1",
    }
    no_msa = decide(facts(NO_MSA))
    assert "lacks the MSA kernels" in no_msa.reason
    assert "msa_block_select" in no_msa.fixes[0].requires[0]
    # Without aiter, AITER sparse PA is off whatever the variables say, so a
    # bf16 fallback at TP 1 needs no VLLM_ROCM_SHUFFLE_KV_CACHE_LAYOUT=0.
    tp1 = decide(facts(NO_AITER, indexer="bf16", kv_heads_per_rank=4))
    assert all(fix.env == () for fix in tp1.fixes if "bf16" in fix.summary)
    assert decide(facts(NO_AITER, kv="auto")).outcome is Outcome.UNCHANGED


def test_drafter_kv_dtype_shares_the_pool_and_every_fix_moves_it_along():
    same = decide(facts(draft_kv_cache_dtype="fp8_e4m3"))  # same precision
    assert (same.outcome, same.indexer_kv_dtype) == (Outcome.INHERITED, "fp8")
    bf16_drafter = decide(facts(draft_kv_cache_dtype="bfloat16"))
    assert bf16_drafter.outcome is Outcome.ERROR
    assert "the MTP drafter would cache bfloat16" in bf16_drafter.reason
    assert bf16_drafter.fixes[0].flags == (
        ("--speculative-config.kv_cache_dtype", "fp8"),
    )
    # The target is refused too (AITER off, indexer CP): a fix that makes the
    # target bf16 also moves an fp8 drafter; one that keeps fp8 leaves it.
    both = decide(facts(MI355X_NO_AITER, draft_kv_cache_dtype="fp8", **CP4))
    by_summary = {fix.summary: dict(fix.flags) for fix in both.fixes}
    assert by_summary["main cache bf16"] == {
        "--kv-cache-dtype": "auto",
        "--speculative-config.kv_cache_dtype": "auto",
    }
    assert (
        "--speculative-config.kv_cache_dtype"
        not in by_summary["keep the fp8 KV cache, fp8 indexer (vLLM's Triton indexer)"]
    )
    # A bf16 target with an fp8 drafter is not "both caches bf16".
    bf16_target = decide(facts(kv="auto", draft_kv_cache_dtype="fp8"))
    assert bf16_target.outcome is Outcome.ERROR


def test_mixed_pool_errors_offer_the_opt_in_and_it_is_honoured():
    refused = decide(facts(MI250X))
    opt_in = refused.fixes[-1]
    assert dict(opt_in.env) == {"VLLM_MINIMAX_M3_KV_ALLOW_MIXED": "1"}
    assert "VLLM_MINIMAX_M3_KV_ALLOW_MIXED=1" in refused.message
    mixed = decide(dataclasses.replace(facts(MI250X), allow_mixed=True))
    assert mixed.outcome is Outcome.MIXED and mixed.starts and not mixed.uniform
    assert "zero" in mixed.reason
    # AITER sparse PA with 4 KV heads per rank runs only the fp8 indexer: the
    # opt-in is not enough, and the first fix says what the bf16 one needs.
    tp1 = decide(facts(indexer="bf16", kv_heads_per_rank=4, allow_mixed=True))
    assert dict(tp1.fixes[0].env) == {
        "VLLM_MINIMAX_M3_KV_ALLOW_MIXED": "1",
        "VLLM_ROCM_SHUFFLE_KV_CACHE_LAYOUT": "0",
    }


def test_non_bf16_main_cache_fixes_name_bf16_when_auto_is_not():
    # --dtype float16: "auto" stores float16 and vLLM refuses a bfloat16 KV
    # cache beside a float16 model, so the fix runs the model in bf16.
    verdict = decide(facts(MI250X, kv="auto", model_dtype="float16"))
    assert verdict.fixes[0].flags[:2] == (
        ("--dtype", "bfloat16"),
        ("--kv-cache-dtype", "auto"),
    )
    # vLLM rejects float16 KV beside a bf16 model by itself: no opt-in offered.
    float16 = decide(facts(MI250X, kv="float16"))
    assert all(
        "VLLM_MINIMAX_M3_KV_ALLOW_MIXED" not in dict(fix.env) for fix in float16.fixes
    )


def test_errors_name_the_fix_for_this_hardware():
    no_aiter = decide(facts(MI355X_NO_AITER, **CP4)).message
    assert "VLLM_ROCM_USE_AITER=1 VLLM_ROCM_SHUFFLE_KV_CACHE_LAYOUT=1" in no_aiter
    assert "--attention-config.minimax_m3_indexer_cp false" in no_aiter
    gfx90a = decide(facts(MI250X)).message
    assert "gfx950" in gfx90a and "gfx942" in gfx90a
    assert "VLLM_ROCM_USE_AITER=1" not in gfx90a
    # Past the MSA top-k with two KV heads per rank: fit the top-k, or leave
    # AITER sparse PA for vLLM's Triton indexer.
    too_long = decide(facts(max_model_len=2_000_000, kv_heads_per_rank=2)).message
    assert "--max-model-len 1048576" in too_long
    assert "VLLM_ROCM_SHUFFLE_KV_CACHE_LAYOUT=0  # keep the fp8 KV cache" in too_long


PUBLISHED = PoolLayers(num_layers=5, sparse=frozenset({3, 4}))
NO_SPARSE = PoolLayers(num_layers=5, sparse=frozenset())
LAYOUTS = [
    PUBLISHED,
    NO_SPARSE,
    dataclasses.replace(PUBLISHED, skip_requested=frozenset({0})),
    dataclasses.replace(PUBLISHED, skip_requested=frozenset({4})),
    dataclasses.replace(PUBLISHED, skip_requested=frozenset({0, 4})),
    dataclasses.replace(NO_SPARSE, skip_requested=frozenset({1})),
    dataclasses.replace(
        PUBLISHED, skip_requested=frozenset({0}), pp_stage_starts=(0, 3)
    ),
]


def _with_drafter(case: PrecisionFacts) -> PrecisionFacts:
    # A drafter with its own KV dtype is the MTP drafter, built sparse.
    if case.draft_kv_cache_dtype is None:
        return case
    return dataclasses.replace(
        case, layers=dataclasses.replace(case.layers, drafter_index_cache=True)
    )


facts_space = st.builds(
    facts,
    platform=st.sampled_from(PLATFORMS),
    kv=st.sampled_from(KV_DTYPES),
    indexer=st.sampled_from(INDEXER_DTYPES),
    max_model_len=st.sampled_from([4096, 8192, 1 << 20, (1 << 20) + 1]),
    indexer_cp=st.booleans(),
    tensor_parallel_size=st.sampled_from([1, 2, 4, 8]),
    kv_heads_per_rank=st.sampled_from([1, 2, 4]),
    model_dtype=st.sampled_from(["bfloat16", "float16"]),
    allow_mixed=st.booleans(),
    draft_kv_cache_dtype=st.sampled_from([None, "auto", "bfloat16", "fp8"]),
    layers=st.sampled_from(LAYOUTS),
).map(_with_drafter)


@given(facts_space)
def test_deterministic_and_explicit_values_are_never_changed(case):
    verdict = decide(case)
    # decide is lru_cached: ask the function itself, twice, past the cache.
    uncached = decide.__wrapped__
    assert uncached(case) == verdict == uncached(case)
    if case.indexer_kv_dtype != "auto":
        assert verdict.indexer_kv_dtype == case.indexer_kv_dtype
    assert verdict.outcome is not Outcome.INHERITED or verdict.indexer_kv_dtype == "fp8"


@given(facts_space)
def test_unchanged_exactly_when_both_caches_are_bf16(case):
    verdict = decide(case)
    main_bf16 = case.kv_cache_dtype == "bfloat16" or (
        case.kv_cache_dtype == "auto" and case.model_dtype == "bfloat16"
    )
    draft = case.draft_kv_cache_dtype
    draft_bf16 = (
        draft is None
        or draft == "bfloat16"
        or (draft == "auto" and case.model_dtype == "bfloat16")
    )
    both_bf16 = main_bf16 and draft_bf16 and case.indexer_kv_dtype in ("auto", "bf16")
    # Without an index cache the indexer dtype is moot. Skipped layers store
    # the model dtype, which can differ from an explicit bf16 KV cache.
    no_skip_mixing = not case.unquantized_dense_layers
    assert (verdict.outcome is Outcome.UNCHANGED) == (
        (both_bf16 or not case.layers.has_index_cache) and no_skip_mixing
    )


@given(facts_space)
def test_mixed_only_by_opt_in_and_never_instead_of_uniform(case):
    verdict = decide(case)
    if verdict.outcome is Outcome.MIXED:
        assert case.allow_mixed
        # An fp8 indexer is mixed only beside layers skipped from fp8.
        assert case.indexer_kv_dtype in ("auto", "bf16") or (
            case.unquantized_dense_layers
        )
    without = decide(dataclasses.replace(case, allow_mixed=False))
    assert without.outcome is not Outcome.MIXED
    if without.outcome is not Outcome.ERROR:
        assert verdict == without  # the opt-in only changes refusals


@given(facts_space)
def test_every_error_has_a_fix(case):
    verdict = decide(case)
    if verdict.outcome is Outcome.ERROR:
        assert verdict.fixes, verdict.message


@given(facts_space)
def test_every_fix_line_reads_back_as_the_fix_it_renders(case):
    # What a user pastes is what the matrix applies: its reader inverts render.
    for fix in decide(case).fixes:
        assert read_fix_line(fix.render()) == fix, fix.render()


@given(facts_space)
def test_every_uniform_verdict_is_fp8_e4m3_on_both_sides(case):
    verdict = decide(case)
    if verdict.uniform:
        assert case.kv_cache_dtype in ("fp8", "fp8_e4m3")
        assert verdict.indexer_kv_dtype in ("fp8", "fp8_e4m3")


def test_bf16_fallbacks_carry_what_bf16_needs_on_this_machine():
    # AITER sparse PA serves several KV heads per rank only with the fp8 indexer.
    def both_bf16(verdict):
        return next(f for f in verdict.fixes if f.summary.startswith("both caches"))

    tp1 = decide(facts(indexer="bf16", kv_heads_per_rank=4))
    assert dict(both_bf16(tp1).env) == {"VLLM_ROCM_SHUFFLE_KV_CACHE_LAYOUT": "0"}
    tp8 = decide(facts(indexer="bf16", kv_heads_per_rank=1, tensor_parallel_size=8))
    assert both_bf16(tp8).env == ()
    # Indexer CP where it cannot run: every fix turns it off.
    cuda_cp = decide(facts(B300, indexer_cp=True))
    for fix in cuda_cp.fixes:
        assert ("--attention-config.minimax_m3_indexer_cp", "false") in fix.flags


def test_every_blocker_is_reported_and_one_fix_clears_them_all():
    # AITER off, a context past the top-k, indexer CP: every reason, and one
    # fix per indexer that clears all of that indexer's.
    verdict = decide(
        facts(MI355X_NO_AITER, max_model_len=MSA_MAX_BLOCKS_PER_ROW * 128 + 1, **CP4)
    )
    assert "AITER sparse paged attention" in verdict.reason
    assert "AITER MSA top-k" in verdict.reason
    assert "(minimax_m3_indexer_cp) only in bf16" in verdict.reason
    keep = _fix_for(verdict, "AITER MSA")
    assert dict(keep.env) == {
        "VLLM_ROCM_USE_AITER": "1",
        "VLLM_ROCM_SHUFFLE_KV_CACHE_LAYOUT": "1",
    }
    assert ("--max-model-len", str(MSA_MAX_BLOCKS_PER_ROW * 128)) in keep.flags


# -- the pool vLLM builds: sparse layers, skipped layers ----------------------


@pytest.mark.parametrize("platform", PLATFORMS)
@pytest.mark.parametrize("kv", ["fp8", "fp8_e5m2", "int8_per_token_head", "auto"])
@pytest.mark.parametrize("indexer", ["auto", "bf16", "fp8", "mxfp4"])
def test_a_pool_without_index_cache_has_no_indexer_question(platform, kv, indexer):
    verdict = decide(facts(platform, kv=kv, indexer=indexer, layers=NO_SPARSE))
    assert verdict.outcome is Outcome.UNCHANGED, verdict.message
    assert verdict.indexer_kv_dtype == indexer
    assert "no layer builds an index cache" in verdict.reason


def test_the_mtp_drafter_brings_an_index_cache_to_a_dense_checkpoint():
    drafter = dataclasses.replace(NO_SPARSE, drafter_index_cache=True)
    verdict = decide(facts(MI250X, layers=drafter))
    assert verdict.outcome is Outcome.ERROR
    assert decide(facts(layers=drafter)).outcome is Outcome.INHERITED


def test_a_skipped_dense_layer_beside_fp8_is_refused_with_fixes_that_start():
    skip = dataclasses.replace(PUBLISHED, skip_requested=frozenset({0}))
    verdict = decide(facts(layers=skip, tensor_parallel_size=8))
    assert verdict.outcome is Outcome.ERROR
    assert verdict.reason.splitlines()[0].endswith(
        ": --kv-cache-dtype-skip-layers keeps layer 0 at bfloat16 beside fp8_e4m3."
    )
    keep, both_bf16, opt_in = verdict.fixes
    assert keep.without == ("--kv-cache-dtype-skip-layers",) and not keep.flags
    assert "remove --kv-cache-dtype-skip-layers from the command" in verdict.message
    assert dict(both_bf16.flags)["--kv-cache-dtype"] == "auto"
    assert dict(opt_in.env) == {"VLLM_MINIMAX_M3_KV_ALLOW_MIXED": "1"}
    # Opted in, the index cache still follows the fp8 main cache.
    mixed = decide(facts(layers=skip, tensor_parallel_size=8, allow_mixed=True))
    assert (mixed.outcome, mixed.indexer_kv_dtype) == (Outcome.MIXED, "fp8")
    assert "layer 0 bfloat16 (--kv-cache-dtype-skip-layers)" in mixed.reason
    # Skips are no-ops beside a bf16 main cache.
    assert decide(facts(kv="auto", layers=skip)).outcome is Outcome.UNCHANGED


def test_a_pool_without_index_cache_is_still_one_precision_or_refused():
    skip = dataclasses.replace(NO_SPARSE, skip_requested=frozenset({1}))
    verdict = decide(facts(MI355X_NO_AITER, layers=skip))
    assert verdict.outcome is Outcome.ERROR
    assert "keeps layer 1 at bfloat16" in verdict.reason
    # Opted in: no index cache, so nothing about an indexer in the warning.
    mixed = decide(facts(MI355X_NO_AITER, layers=skip, allow_mixed=True))
    assert mixed.outcome is Outcome.MIXED and "indexer" not in mixed.reason


def test_a_skipped_sparse_layer_is_ignored_by_vllm_and_said_so():
    skip = dataclasses.replace(PUBLISHED, skip_requested=frozenset({4}))
    verdict = decide(facts(layers=skip))
    assert verdict.outcome is Outcome.INHERITED
    assert verdict.notes == (
        "MiniMax-M3 sparse attention ignores --kv-cache-dtype-skip-layers for "
        "layer 4: its main cache stays fp8_e4m3.",
    )
    assert decide(facts(kv="auto", layers=skip)).notes == ()  # nothing to skip


def test_stages_are_named_where_the_pool_is_pipelined():
    skip = dataclasses.replace(
        PUBLISHED, skip_requested=frozenset({0, 1}), pp_stage_starts=(0, 3)
    )
    verdict = decide(facts(layers=skip))
    assert "layers 0, 1 (pipeline stage 0 of 2)" in verdict.reason


@settings(max_examples=1500)
@example(facts(kv="auto", indexer="fp8", layers=LAYOUTS[2]))  # found by the matrix
@given(facts_space)
def test_no_fix_leaves_a_skipped_layer_beside_a_quantized_main(case):
    # Judged on the config each fix leads to: beside a bf16 main cache a skip
    # is a no-op, and a fix that switches to fp8 would make it count.
    verdict = decide(case)
    if verdict.outcome is not Outcome.ERROR:
        return
    for fix in verdict.fixes:
        assert (
            "VLLM_MINIMAX_M3_KV_ALLOW_MIXED" in fix.env_map
            or not fixed_facts(case, fix).unquantized_dense_layers
        ), (fix, verdict.message)


def test_unset_aiter_variables_are_said_to_be_unset():
    unset = dataclasses.replace(
        MI355X_NO_AITER,
        unset_env=frozenset(
            {"VLLM_ROCM_USE_AITER", "VLLM_ROCM_SHUFFLE_KV_CACHE_LAYOUT"}
        ),
    )
    message = decide(facts(unset, **CP4)).message
    assert "(VLLM_ROCM_USE_AITER unset, VLLM_ROCM_SHUFFLE_KV_CACHE_LAYOUT unset)" in (
        message
    )
    set_to_zero = decide(facts(MI355X_NO_AITER, **CP4)).message
    assert "VLLM_ROCM_USE_AITER=0, VLLM_ROCM_SHUFFLE_KV_CACHE_LAYOUT=0" in set_to_zero


# -- every message reads right for every main dtype ---------------------------

E4M3 = ("fp8", "fp8_e4m3")


@pytest.mark.parametrize("kv", KV_DTYPES)
@pytest.mark.parametrize(
    "platform", [MI355X, MI355X_NO_AITER, MI300X, MI250X, B300, A100]
)
def test_fix_labels_and_sentences_fit_every_main_dtype(platform, kv):
    for indexer in INDEXER_DTYPES:
        for allow_mixed in (False, True):
            case = facts(
                platform,
                kv=kv,
                indexer=indexer,
                tensor_parallel_size=8,
                allow_mixed=allow_mixed,
            )
            verdict = decide(case)
            reason = verdict.reason
            # Refusals are sentences; other reasons are clauses the hook wraps.
            assert reason.endswith(".") == (verdict.outcome is Outcome.ERROR), reason
            for garble in (" means two", ";;", "; ;", "..", " ,", "  ", ".;", ";."):
                assert garble not in reason, (garble, reason)
            if "the fp8 main cache" in reason:
                assert kv in E4M3, reason
            for fix in verdict.fixes:
                sets_kv = dict(fix.flags).get("--kv-cache-dtype")
                if "keep the fp8 KV cache" in fix.summary:
                    assert kv in E4M3 and sets_kv is None, (kv, fix)
                if sets_kv == "fp8" and kv not in E4M3:
                    assert "keep" not in fix.summary, (kv, fix)
                assert "  " not in fix.render().split("  # ", 1)[0], fix.render()


def test_a_non_e4m3_main_cache_is_switched_not_kept():
    verdict = decide(facts(B300, kv="fp8_e5m2"))
    labels = [fix.summary for fix in verdict.fixes]
    assert "fp8 KV cache and fp8 indexer" in labels
    assert not any("keep the fp8 KV cache" in label for label in labels)
    explicit = decide(facts(indexer="bf16")).reason
    assert explicit.splitlines()[0].endswith(
        "an explicit bf16 indexer would sit beside the fp8 main cache."
    )
    assert explicit.splitlines()[-1] == MIXED_POOL_HAZARD


# -- bf16 pools vLLM itself cannot build (check reports them; #38 item 5) -----


def test_a_bf16_pool_vllm_fails_to_build_is_an_error_with_fixes_that_build():
    # AITER sparse PA at four KV heads per rank needs the MSA indexer's page
    # table, which needs an fp8 index cache.
    aiter_tp1 = facts(kv="auto", kv_heads_per_rank=4)
    assert decide(aiter_tp1).outcome is Outcome.UNCHANGED  # the plugin's part
    verdict = bf16_pool_vllm_cannot_build(aiter_tp1)
    assert verdict is not None and verdict.outcome is Outcome.ERROR
    assert "tensor_parallel_size=1 leaves 4" in verdict.reason
    for fix in verdict.fixes:
        fixed = fixed_facts(aiter_tp1, fix)
        if dict(fix.env).get("VLLM_ROCM_SHUFFLE_KV_CACHE_LAYOUT") == "0":
            fixed = dataclasses.replace(
                fixed,
                platform=dataclasses.replace(
                    fixed.platform, shuffle_kv_cache_layout=False
                ),
            )
        assert bf16_pool_vllm_cannot_build(fixed) is None, fix
        assert decide(fixed).starts, fix
    # Indexer CP where it cannot run fails for bf16 too.
    cp = bf16_pool_vllm_cannot_build(facts(B300, kv="auto", indexer_cp=True))
    assert cp is not None and "minimax_m3_indexer_cp" in cp.reason


@pytest.mark.parametrize(
    "case",
    [
        facts(kv="auto"),  # one KV head per rank
        facts(MI355X_NO_AITER, kv="auto", kv_heads_per_rank=4),
        facts(kv="fp8", kv_heads_per_rank=4),  # not bf16: the rules above
        facts(kv="auto", kv_heads_per_rank=4, layers=NO_SPARSE),
    ],
)
def test_bf16_pools_vllm_builds_are_left_alone(case):
    assert bf16_pool_vllm_cannot_build(case) is None


def test_every_fix_applied_whole_starts():
    # facts_with_fix applies a fix's variables as well as its flags (what the
    # capacity of each fix in check is computed on).
    cases = [
        facts(MI355X_NO_AITER, indexer_cp=True, tensor_parallel_size=4),
        facts(indexer="bf16", kv_heads_per_rank=4),
        facts(MI250X),
        facts(B300, draft_kv_cache_dtype="auto"),
        facts(kv="fp8_e5m2", tensor_parallel_size=8),
    ]
    for case in cases:
        refused = decide(case)
        assert refused.outcome is Outcome.ERROR, case
        for fix in refused.fixes:
            assert decide(facts_with_fix(case, fix)).starts, (case, fix)
    aiter = facts_with_fix(
        facts(MI355X_NO_AITER),
        Fix("x", env=(("VLLM_ROCM_USE_AITER", "1"),)),
    )
    assert aiter.platform.aiter_enabled and not aiter.platform.shuffle_kv_cache_layout
