"""The pool vLLM actually builds: which layers are sparse, which main caches
skip quantization.

vLLM 0.33 builds MiniMax-M3's sparse layers from ``sparse_attention_freq``
alone (``use_sparse_attention`` is read by no model code), builds the MTP
drafter's layer sparse whatever the checkpoint says, and keeps the main cache
of a layer named by ``--kv-cache-dtype-skip-layers`` unquantized only in the
dense layers (its generic ``Attention``); the sparse attention ignores the
request. Real config, the model on the meta device and vLLM's planner, on a
simulated MI355X with AITER sparse PA (the MI355X recipe) and on SM100.
"""

from __future__ import annotations

import re

import pytest

from vllm_minimax_m3_kv_sim import REPO
from vllm_minimax_m3_kv_sim.engine import TINY_MODEL
from vllm_minimax_m3_kv_sim.environments import AITER_SPARSE_PA, STOCK_VLLM

AITER_OFF = {"VLLM_ROCM_USE_AITER": "0", "VLLM_ROCM_SHUFFLE_KV_CACHE_LAYOUT": "0"}
ALLOW_MIXED = {"VLLM_MINIMAX_M3_KV_ALLOW_MIXED": "1"}
DATA = REPO / "tests" / "data"
KEY_FALSE = str(DATA / "minimax_m3_tiny_key_false")  # freq still marks 3, 4
NO_SPARSE = str(DATA / "minimax_m3_tiny_no_sparse")  # key true, freq all 0
FP8 = {"kv_cache_dtype": "fp8", "max_model_len": 8192}

MI355X = [
    # TP 1: four KV heads per rank, so AITER sparse PA needs the fp8 indexer.
    {
        "id": "key_false_tp1",
        "env": AITER_SPARSE_PA,
        "engine": {**FP8, "model": KEY_FALSE},
    },
    {
        "id": "no_sparse_aiter_off",
        "env": AITER_OFF,
        "engine": {**FP8, "model": NO_SPARSE},
    },
    {
        "id": "no_sparse_fp8_indexer",
        "env": AITER_OFF,
        "engine": {
            **FP8,
            "model": NO_SPARSE,
            "attention_config": {"indexer_kv_dtype": "fp8"},
        },
    },
    {
        "id": "skip_dense",
        "env": AITER_SPARSE_PA,
        "engine": {
            **FP8,
            "tensor_parallel_size": 8,
            "kv_cache_dtype_skip_layers": ["0"],
        },
    },
    {
        "id": "skip_dense_opted_in",
        "env": {**AITER_SPARSE_PA, **ALLOW_MIXED},
        "engine": {
            **FP8,
            "tensor_parallel_size": 8,
            "kv_cache_dtype_skip_layers": ["0"],
        },
    },
    {
        "id": "skip_sparse",
        "env": AITER_SPARSE_PA,
        "engine": {
            **FP8,
            "tensor_parallel_size": 8,
            "kv_cache_dtype_skip_layers": ["4"],
        },
    },
    {
        # AITER off with indexer CP: vLLM's Triton indexer stays bf16.
        "id": "skip_dense_aiter_off",
        "env": AITER_OFF,
        "engine": {
            **FP8,
            "tensor_parallel_size": 8,
            "kv_cache_dtype_skip_layers": ["1"],
            "attention_config": {"minimax_m3_indexer_cp": True},
        },
    },
]


@pytest.fixture(scope="module")
def mi355x(scenario_runner):
    return scenario_runner("mi355x", MI355X)


@pytest.fixture(scope="module")
def mi355x_stock(scenario_runner):
    wanted = {"no_sparse_aiter_off", "no_sparse_fp8_indexer", "skip_dense"}
    return scenario_runner(
        "mi355x", [s for s in MI355X if s["id"] in wanted], env=STOCK_VLLM
    )


def plugin_error(result: dict) -> str:
    error = result.get("config_error")
    assert error is not None and error["from_plugin"], result
    return error["message"]


def uniform(plan: dict) -> bool:
    return (
        not any(plan["workers"])
        and not any(plan["worker_mixed"])
        and (not plan["scheduler"])
    )


def test_sparse_layers_come_from_sparse_attention_freq_not_the_key(mi355x):
    # use_sparse_attention: false, but vLLM builds layers 3 and 4 sparse: the
    # indexer inherits fp8 and the model builds (it failed deep in model build
    # with "AITER sparse paged attention requires num_kv_heads == 1 ...").
    result = mi355x["key_false_tp1"]
    assert "build_error" not in result, result
    assert result["pool_layers"]["sparse"] == [3, 4]
    assert result["indexer_kv_dtype"] == "fp8"
    assert result["indexer_impls"] == ["MiniMaxM3IndexerMSAImpl"]
    assert uniform(result["pp1"]) and uniform(result["pp2"])


def test_a_pool_without_index_cache_is_left_to_vllm(mi355x, mi355x_stock):
    # use_sparse_attention: true, no layer marked: no index cache, so no
    # indexer question, and no refusal for a pool of one precision.
    for scenario in ("no_sparse_aiter_off", "no_sparse_fp8_indexer"):
        ours, stock = mi355x[scenario], mi355x_stock[scenario]
        assert "config_error" not in ours, ours
        assert ours["pool_layers"]["sparse"] == []
        assert not any(name.endswith("index_cache") for name in ours["specs"])
        assert ours["pp1"] == stock["pp1"] and ours["pp2"] == stock["pp2"]
        assert uniform(ours["pp1"])


def test_skipping_a_dense_layer_is_refused_at_config_time(mi355x, mi355x_stock):
    message = plugin_error(mi355x["skip_dense"])
    assert "--kv-cache-dtype-skip-layers keeps layer 0 at bfloat16" in message
    fixes = message.split("Fix with one of:")[1]
    assert "remove --kv-cache-dtype-skip-layers from the command" in fixes
    assert "VLLM_MINIMAX_M3_KV_ALLOW_MIXED=1" in fixes
    # Stock vLLM starts it with a mixed pool whose zeroer the scheduler drops.
    stock = mi355x_stock["skip_dense"]["pp1"]
    assert (stock["worker_mixed"], stock["scheduler"]) == ([True], False)


def test_opted_in_skip_keeps_fp8_indexer_and_zeroes_everywhere(mi355x):
    result = mi355x["skip_dense_opted_in"]
    assert "config_error" not in result, result
    assert result["indexer_kv_dtype"] == "fp8"  # still inherited
    for split in ("pp1", "pp2"):
        plan = result[split]
        assert all(plan["workers"]) and plan["scheduler"], (split, plan)
    assert any("mixed KV pool" in w for w in result["plugin_warnings"])


def test_skipping_a_sparse_layer_is_ignored_with_one_warning(mi355x):
    result = mi355x["skip_sparse"]
    assert "config_error" not in result, result
    assert uniform(result["pp1"]) and uniform(result["pp2"])
    assert result["pool_layers"]["skip_ignored"] == [4]
    warnings = [w for w in result["plugin_warnings"] if "ignores" in w]
    assert warnings == [
        "MiniMax-M3 sparse attention ignores --kv-cache-dtype-skip-layers for "
        "layer 4: its main cache stays fp8_e4m3."
    ]


def test_other_refusals_drop_the_skip_list_from_fixes_that_keep_fp8(mi355x):
    message = plugin_error(mi355x["skip_dense_aiter_off"])
    assert "Also, --kv-cache-dtype-skip-layers keeps layer 1 at bfloat16" in message
    fixes = message.split("Fix with one of:")[1].strip().splitlines()
    keep_fp8 = [fix for fix in fixes if "keep the fp8 KV cache" in fix]
    assert (
        keep_fp8
        and "remove --kv-cache-dtype-skip-layers from the command" in keep_fp8[0]
    )
    bf16 = [fix for fix in fixes if "--kv-cache-dtype auto" in fix]
    assert bf16 and all(
        "remove --kv-cache-dtype-skip-layers" not in fix for fix in bf16
    )


# -- the plugin's facts against the specs vLLM's layers return ------------------


@pytest.mark.parametrize("platform", ["mi355x", "b300"])
def test_facts_name_exactly_the_layers_vllm_keeps_unquantized(
    scenario_runner, platform
):
    engine = {
        **FP8,
        "tensor_parallel_size": 8,
        "kv_cache_dtype_skip_layers": ["0", "2", "4"],
    }
    env = {**AITER_SPARSE_PA, **ALLOW_MIXED} if platform == "mi355x" else ALLOW_MIXED
    result = scenario_runner(platform, [{"id": "skips", "env": env, "engine": engine}])
    result = result["skips"]
    assert "build_error" not in result, result
    main_dtypes = {
        int(re.search(r"layers\.(\d+)\.", name).group(1)): dtype
        for name, (dtype, *_) in result["specs"].items()
        if not name.endswith("index_cache")
    }
    unquantized = sorted(i for i, d in main_dtypes.items() if d == "torch.bfloat16")
    assert unquantized == result["pool_layers"]["unquantized_dense"] == [0, 2]
    assert result["pool_layers"]["skip_ignored"] == [4]
    assert main_dtypes[4] == "torch.uint8"


def test_published_checkpoint_layers_are_unchanged(scenario_runner):
    result = scenario_runner(
        "b300", [{"id": "fp8", "engine": {**FP8, "model": TINY_MODEL}}]
    )["fp8"]
    assert result["pool_layers"] == {
        "sparse": [3, 4],
        "unquantized_dense": [],
        "skip_ignored": [],
    }
