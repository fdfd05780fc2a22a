"""The pure policy: table cases and properties over the whole flag space."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st

from vllm_minimax_m3_kv.config.indexer_precision import (
    MSA_MAX_BLOCKS_PER_ROW,
    Outcome,
    PlatformFacts,
    PrecisionFacts,
    SparseShape,
    decide,
)

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
MI300X = dataclasses.replace(MI355X, name="ROCm gfx942 (MI300X)", rocm_gfx950=False)
B300 = PlatformFacts(
    "CUDA sm_103", "cuda", cuda_supports_fp8=True, cuda_sm100_family=True
)
A100 = PlatformFacts("CUDA sm_80", "cuda")
CPU = PlatformFacts("platform 'cpu'", "other")
PLATFORMS = [MI355X, MI355X_NO_AITER, MI300X, B300, A100, CPU]
KV_DTYPES = ["auto", "bfloat16", "fp8", "fp8_e4m3", "fp8_e5m2"]
INDEXER_DTYPES = ["auto", "bf16", "fp8", "fp8_e4m3", "mxfp4"]


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
        (facts(MI355X_NO_AITER), Outcome.ERROR, "auto"),
        (facts(MI300X), Outcome.ERROR, "auto"),
        (facts(A100), Outcome.ERROR, "auto"),
        (facts(CPU), Outcome.ERROR, "auto"),
        (facts(indexer="bf16"), Outcome.ERROR, "bf16"),
        (facts(kv="auto", indexer="fp8"), Outcome.ERROR, "fp8"),
        (facts(kv="fp8_e5m2"), Outcome.ERROR, "auto"),
        (facts(kv="auto"), Outcome.UNCHANGED, "auto"),
        (facts(MI300X, kv="bfloat16", indexer="bf16"), Outcome.UNCHANGED, "bf16"),
        (facts(B300, indexer_cp=True), Outcome.ERROR, "auto"),
        (
            facts(max_model_len=MSA_MAX_BLOCKS_PER_ROW * 128 + 1),
            Outcome.ERROR,
            "auto",
        ),
        (facts(shape=SparseShape(topk_blocks=32)), Outcome.ERROR, "auto"),
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


def test_errors_name_the_fix_for_this_hardware():
    no_aiter = decide(facts(MI355X_NO_AITER)).message
    assert "VLLM_ROCM_USE_AITER=1 VLLM_ROCM_SHUFFLE_KV_CACHE_LAYOUT=1" in no_aiter
    gfx942 = decide(facts(MI300X)).message
    assert "gfx950" in gfx942 and "VLLM_ROCM_USE_AITER=1" not in gfx942
    too_long = decide(facts(max_model_len=2_000_000)).message
    assert "--max-model-len 1048576" in too_long


facts_space = st.builds(
    facts,
    platform=st.sampled_from(PLATFORMS),
    kv=st.sampled_from(KV_DTYPES),
    indexer=st.sampled_from(INDEXER_DTYPES),
    max_model_len=st.sampled_from([4096, 8192, 1 << 20, (1 << 20) + 1]),
    indexer_cp=st.booleans(),
    tensor_parallel_size=st.sampled_from([1, 2, 4, 8]),
    kv_heads_per_rank=st.sampled_from([1, 2, 4]),
)


@given(facts_space)
def test_deterministic_and_explicit_values_are_never_changed(case):
    verdict = decide(case)
    assert decide(case) == verdict
    if case.indexer_kv_dtype != "auto":
        assert verdict.indexer_kv_dtype == case.indexer_kv_dtype
    assert verdict.outcome is not Outcome.INHERITED or verdict.indexer_kv_dtype == "fp8"


@given(facts_space)
def test_fp8_on_neither_side_is_always_unchanged(case):
    verdict = decide(case)
    neither = not case.kv_cache_dtype.startswith("fp8") and case.indexer_kv_dtype in (
        "auto",
        "bf16",
        "mxfp4",
    )
    assert (verdict.outcome is Outcome.UNCHANGED) == neither


@given(facts_space)
def test_every_uniform_verdict_is_fp8_e4m3_on_both_sides(case):
    verdict = decide(case)
    if verdict.uniform:
        assert case.kv_cache_dtype in ("fp8", "fp8_e4m3")
        assert verdict.indexer_kv_dtype in ("fp8", "fp8_e4m3")


def test_bf16_fallbacks_carry_what_bf16_needs_on_this_machine():
    # AITER sparse PA serves several KV heads per rank only with the fp8 indexer.
    tp1 = decide(facts(indexer="bf16", kv_heads_per_rank=4))
    fallback = tp1.fixes[-1]
    assert dict(fallback.env) == {"VLLM_ROCM_SHUFFLE_KV_CACHE_LAYOUT": "0"}
    tp8 = decide(facts(indexer="bf16", kv_heads_per_rank=1, tensor_parallel_size=8))
    assert tp8.fixes[-1].env == ()
    # Indexer CP where it cannot run: every fix turns it off.
    cuda_cp = decide(facts(B300, indexer_cp=True))
    for fix in cuda_cp.fixes:
        assert ("--attention-config.minimax_m3_indexer_cp", "false") in fix.flags


def test_every_blocker_is_reported_and_one_fix_clears_them_all():
    # AITER off and a context past the top-k: both reasons, one combined fix.
    verdict = decide(
        facts(MI355X_NO_AITER, max_model_len=MSA_MAX_BLOCKS_PER_ROW * 128 + 1)
    )
    assert "AITER sparse paged attention" in verdict.reason
    assert "AITER MSA top-k" in verdict.reason
    keep = verdict.fixes[0]
    assert dict(keep.env) == {
        "VLLM_ROCM_USE_AITER": "1",
        "VLLM_ROCM_SHUFFLE_KV_CACHE_LAYOUT": "1",
    }
    assert ("--max-model-len", str(MSA_MAX_BLOCKS_PER_ROW * 128)) in keep.flags
