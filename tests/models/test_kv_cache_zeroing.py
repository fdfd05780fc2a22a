"""One KV zeroing decision per MiniMax-M3 engine (vLLM PR #64472's matrix).

Real vLLM 0.33 config, the MiniMax-M3 model on the meta device and vLLM's KV
planner, on simulated MI355X with AITER off (the public recipe: fp8 main cache;
an explicit bf16 indexer beside it is mixed). Mixed pools exist here only by
the explicit opt-in, and then
every worker and the scheduler must zero new blocks: with the sparse layers in
the second PP stage (the checkpoint's layout), in the first, and at PP 1.
Uniform pools zero nowhere. Stock vLLM (plugin excluded) shows the failure, so
none of this is vacuous; a non-MiniMax model's mixed pool stays as stock.
"""

from __future__ import annotations

import pytest

from vllm_minimax_m3_kv_sim.engine import (
    TINY_LLAMA,
    TINY_MODEL,
    TINY_MODEL_SPARSE_FIRST,
)
from vllm_minimax_m3_kv_sim.environments import AITER_SPARSE_PA, STOCK_VLLM

AITER_OFF = {"VLLM_ROCM_USE_AITER": "0", "VLLM_ROCM_SHUFFLE_KV_CACHE_LAYOUT": "0"}
ALLOW_MIXED = {"VLLM_MINIMAX_M3_KV_ALLOW_MIXED": "1"}
FP8 = {"kv_cache_dtype": "fp8", "tensor_parallel_size": 8}
BF16_INDEXER = {"attention_config": {"indexer_kv_dtype": "bf16"}}

SCENARIOS = [
    {
        "id": "mixed_second_stage",
        "env": {**AITER_OFF, **ALLOW_MIXED},
        "engine": {**FP8, **BF16_INDEXER, "model": TINY_MODEL},
    },
    {
        "id": "mixed_first_stage",
        "env": {**AITER_OFF, **ALLOW_MIXED},
        "engine": {**FP8, **BF16_INDEXER, "model": TINY_MODEL_SPARSE_FIRST},
    },
    {"id": "uniform", "env": AITER_SPARSE_PA, "engine": {**FP8, "model": TINY_MODEL}},
    # The public recipe: vLLM's Triton indexer takes the inherited fp8.
    {
        "id": "uniform_aiter_off",
        "env": AITER_OFF,
        "engine": {**FP8, "model": TINY_MODEL},
    },
    # The same engine whose cache_config is changed after the hook decided.
    {
        "id": "cache_dtype_changed_after_decision",
        "env": AITER_OFF,
        "engine": {**FP8, "model": TINY_MODEL},
        "cache_dtype_after_decision": "auto",
        "walk_after_decision": True,
    },
]


@pytest.fixture(scope="module")
def plugin(scenario_runner):
    return scenario_runner("mi355x", SCENARIOS)


@pytest.fixture(scope="module")
def stock(scenario_runner):
    return scenario_runner("mi355x", SCENARIOS, env=STOCK_VLLM)


@pytest.mark.parametrize("layout", ["mixed_second_stage", "mixed_first_stage"])
def test_opted_in_mixed_pool_zeroes_on_every_worker_and_the_scheduler(plugin, layout):
    result = plugin[layout]
    assert result["indexer_kv_dtype"] == "bf16"  # the request is kept
    assert result["pp1"]["worker_mixed"] == [True]
    assert (result["pp1"]["workers"], result["pp1"]["scheduler"]) == ([True], True)
    # Only one stage holds the bf16 index caches; both zero, and so does the
    # scheduler that sends them blocks to zero.
    assert sorted(result["pp2"]["worker_mixed"]) == [False, True]
    assert (result["pp2"]["workers"], result["pp2"]["scheduler"]) == (
        [True, True],
        True,
    )


def test_mixed_stage_order_is_the_one_declared(plugin):
    assert plugin["mixed_second_stage"]["pp2"]["worker_mixed"] == [False, True]
    assert plugin["mixed_first_stage"]["pp2"]["worker_mixed"] == [True, False]


@pytest.mark.parametrize("scenario", ["uniform", "uniform_aiter_off"])
def test_uniform_pool_zeroes_nowhere(plugin, scenario):
    assert plugin[scenario]["indexer_kv_dtype"] == "fp8"
    for plan in (plugin[scenario]["pp1"], plugin[scenario]["pp2"]):
        assert not any(plan["workers"]) and not plan["scheduler"], plan


def test_hooks_after_the_decision_read_it_not_cache_config(plugin):
    # The main layers now store bf16 (vLLM's Attention reads cache_config),
    # but the index cache keeps the description the decision gave it, and the
    # planner's check still says what was decided against what was built.
    result = plugin["cache_dtype_changed_after_decision"]
    assert result["kv_cache_dtype"] == "auto"
    index_caches = {
        name: spec[:2]
        for name, spec in result["specs"].items()
        if name.endswith("index_cache")
    }
    assert index_caches, result["specs"]
    assert all(
        spec == ["torch.uint8", "FP8_PER_TENSOR"] for spec in index_caches.values()
    )
    assert any(
        "predicted one precision: main cache fp8" in warning
        and "bfloat16/NONE" in warning
        for warning in result["plan_warnings"]
    ), result["plan_warnings"]


def test_model_build_and_planning_never_decide_again(plugin):
    # After the hook: the index cache's wrappers and the planner's checks
    # read the recorded decision; none gathers the facts or asks the policy.
    walk = set(plugin["cache_dtype_changed_after_decision"]["after_decision_walk"])
    config = "vllm_minimax_m3_kv.config"
    assert f"{config}.recorded_verdict:recorded_verdict" in walk, sorted(walk)
    deciding = [
        entry
        for entry in walk
        if entry.startswith(f"{config}.indexer_precision:")
        or entry.split(":")[-1]
        in ("live_facts", "live_platform_facts", "precision_facts")
    ]
    assert not deciding, sorted(walk)


@pytest.mark.parametrize(
    ("layout", "pp2_workers"),
    [("mixed_second_stage", [False, True]), ("mixed_first_stage", [True, False])],
)
def test_stock_vllm_drops_the_zeroing_decision(stock, layout, pp2_workers):
    result = stock[layout]
    assert (result["pp1"]["workers"], result["pp1"]["scheduler"]) == ([True], False)
    assert (result["pp2"]["workers"], result["pp2"]["scheduler"]) == (
        pp2_workers,
        False,
    )


# Layer 0 keeps a bf16 cache beside fp8 layers (--kv-cache-dtype-skip-layers).
LLAMA_MIXED = [
    {
        "id": "llama_mixed",
        "engine": {
            "model": TINY_LLAMA,
            "kv_cache_dtype": "fp8",
            "kv_cache_dtype_skip_layers": ["0"],
        },
    }
]


def test_non_minimax_mixed_pool_behaves_as_stock(scenario_runner):
    # The simulated CUDA platform stands in the custom ops a Llama layer binds.
    ours = scenario_runner("b300", LLAMA_MIXED)["llama_mixed"]
    theirs = scenario_runner("b300", LLAMA_MIXED, env=STOCK_VLLM)["llama_mixed"]
    assert ours["pp1"]["worker_mixed"] == [True]  # really a mixed pool
    for pp in ("pp1", "pp2"):
        assert ours[pp] == theirs[pp]
    assert ours["pp1"]["scheduler"] is False  # stock's behaviour, untouched
