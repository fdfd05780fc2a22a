"""The main KV dtype vLLM builds, from the flag and from the checkpoint, and
the policy's verdicts and fixes on it (pure functions; the live build of the
same cases is ``tests/models/test_checkpoint_kv_cache.py``)."""

from __future__ import annotations

import dataclasses

import pytest

from tests.config.test_indexer_precision import CP4, MI355X, MI355X_NO_AITER
from vllm_minimax_m3_kv.config.indexer_precision import decide
from vllm_minimax_m3_kv.config.kv_cache_dtype import (
    applied_kv_cache,
    compressed_tensors_kv_cache,
    modelopt_kv_cache,
)
from vllm_minimax_m3_kv.config.pool_facts import (
    DRAFT_KV_CACHE_DTYPE_FLAG,
    KV_CACHE_DTYPE_FLAG,
    PoolLayers,
    PrecisionFacts,
    kv_cache_dtype_for,
)
from vllm_minimax_m3_kv.config.verdicts import Outcome, fixed_facts

SCHEME = {"num_bits": 8, "type": "float", "strategy": "tensor", "dynamic": False}
CT = {"quant_method": "compressed-tensors", "kv_cache_scheme": SCHEME}
CT_DECLARED = compressed_tensors_kv_cache(CT, "compressed-tensors")
PUBLISHED_LAYERS = PoolLayers(num_layers=5, sparse=frozenset({3, 4}))


def test_compressed_tensors_declares_fp8_only_with_a_kv_cache_scheme():
    assert CT_DECLARED is not None
    assert (CT_DECLARED.dtype, CT_DECLARED.field) == (
        "fp8",
        "compressed-tensors kv_cache_scheme",
    )
    assert CT_DECLARED.applied_at_model_build
    weights_only = {"quant_method": "compressed-tensors", "kv_cache_scheme": None}
    assert compressed_tensors_kv_cache(weights_only, "compressed-tensors") is None
    # vLLM picked another quantization method: Attention never sees the scheme.
    assert compressed_tensors_kv_cache(CT, "fp8") is None


def test_modelopt_is_what_vllms_own_mapping_resolved():
    modelopt = {
        "quant_method": "modelopt",
        "quantization": {"kv_cache_quant_algo": "FP8"},
    }
    declared = modelopt_kv_cache(modelopt, "fp8_e4m3")
    assert declared is not None and not declared.applied_at_model_build
    assert declared.field == "modelopt kv_cache_quant_algo"
    assert modelopt_kv_cache(modelopt, None) is None
    assert modelopt_kv_cache(modelopt, "auto") is None  # unknown algo: vLLM's "auto"


@pytest.mark.parametrize(
    ("flag", "dense_layers", "expected"),
    [
        ("auto", True, "fp8"),  # Attention.__init__ makes auto fp8
        ("auto", False, "auto"),  # no generic Attention: vLLM ignores the scheme
        ("bfloat16", True, "bfloat16"),  # an explicit dtype wins
        ("fp8_e5m2", True, "fp8_e5m2"),
    ],
)
def test_effective_dtype_follows_where_vllm_applies_the_scheme(
    flag, dense_layers, expected
):
    auto = applied_kv_cache(CT_DECLARED, dense_layers)
    main = PrecisionFacts(
        platform=MI355X,
        kv_cache_dtype=kv_cache_dtype_for(flag, auto and auto.dtype),
        kv_cache_flag=flag,
        kv_cache_source=auto and auto.field,
        auto_kv_cache_dtype=auto and auto.dtype,
        indexer_kv_dtype="auto",
        max_model_len=8192,
    )
    assert main.kv_cache_dtype == expected
    assert main.kv_from_checkpoint == (flag == "auto" and dense_layers)


def checkpoint_facts(platform=MI355X, **changes) -> PrecisionFacts:
    assert CT_DECLARED is not None
    facts = PrecisionFacts(
        platform=platform,
        kv_cache_dtype=CT_DECLARED.dtype,
        kv_cache_flag="auto",
        kv_cache_source=CT_DECLARED.field,
        auto_kv_cache_dtype=CT_DECLARED.dtype,
        indexer_kv_dtype="auto",
        max_model_len=8192,
        tensor_parallel_size=8,
        layers=PUBLISHED_LAYERS,
    )
    return dataclasses.replace(facts, **changes)


def test_a_declared_fp8_cache_is_inherited_like_the_flag():
    verdict = decide(checkpoint_facts())
    assert verdict.outcome is Outcome.INHERITED
    assert verdict.indexer_kv_dtype == "fp8"
    assert "compressed-tensors kv_cache_scheme" in verdict.reason


def test_an_explicit_fp8_indexer_beside_a_declared_fp8_cache_is_uniform():
    verdict = decide(checkpoint_facts(indexer_kv_dtype="fp8"))
    assert verdict.outcome is Outcome.UNIFORM


def test_refusal_fixes_turn_a_declared_cache_off_with_bfloat16():
    # AITER off with indexer CP at TP 4: vLLM's Triton indexer stays bf16.
    facts = dataclasses.replace(checkpoint_facts(platform=MI355X_NO_AITER), **CP4)
    verdict = decide(facts)
    assert verdict.outcome is Outcome.ERROR
    assert "declares an fp8 KV cache (compressed-tensors kv_cache_scheme)" in (
        verdict.reason
    )
    kv_flags = [dict(fix.flags).get(KV_CACHE_DTYPE_FLAG) for fix in verdict.fixes]
    assert "bfloat16" in kv_flags and "auto" not in kv_flags
    (bf16_fix,) = [f for f in verdict.fixes if KV_CACHE_DTYPE_FLAG in dict(f.flags)]
    assert decide(fixed_facts(facts, bf16_fix)).outcome is Outcome.UNCHANGED
    # The AITER fix is environment: the same facts on an AITER-on platform.
    assert decide(dataclasses.replace(facts, platform=MI355X)).uniform


def test_a_fix_setting_auto_gets_the_checkpoints_dtype_back():
    from vllm_minimax_m3_kv.config.verdicts import Fix

    bf16 = checkpoint_facts(kv_cache_dtype="bfloat16", kv_cache_flag="bfloat16")
    assert not bf16.kv_from_checkpoint
    fixed = fixed_facts(bf16, Fix("auto", flags=((KV_CACHE_DTYPE_FLAG, "auto"),)))
    assert fixed.kv_cache_dtype == "fp8"
    assert fixed.kv_from_checkpoint


def test_drafter_follows_what_the_target_stores_not_auto():
    # The MTP drafter's "auto" is the model dtype (its layer is sparse, and
    # vLLM applies the scheme only in Attention): beside a declared fp8 target
    # it is a mismatch, and the fix gives it fp8.
    verdict = decide(checkpoint_facts(draft_kv_cache_dtype="auto"))
    assert verdict.outcome is Outcome.ERROR
    (fix,) = verdict.fixes
    assert dict(fix.flags) == {DRAFT_KV_CACHE_DTYPE_FLAG: "fp8"}
    # A dotted flag after a JSON --speculative-config replaces the JSON.
    assert 'put "kv_cache_dtype": "fp8" in it instead' in fix.render()
