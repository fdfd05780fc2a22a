"""End to end on real vLLM 0.33: config -> MiniMax-M3 on meta -> KV planner.

Every scenario goes through ``EngineArgs(...).create_engine_config()`` with the
plugin loaded from its entry point, on a simulated MI355X, MI300X or B300. The
"stock" scenarios exclude the plugin with ``VLLM_PLUGINS`` and show the failure
the plugin exists for, so the uniform results below are not vacuous.
"""

from __future__ import annotations

import pytest

AITER_ON = {"VLLM_ROCM_USE_AITER": "1", "VLLM_ROCM_SHUFFLE_KV_CACHE_LAYOUT": "1"}
FP8 = {"kv_cache_dtype": "fp8", "max_model_len": 8192}
FP8_INDEXER = {"indexer_kv_dtype": "fp8"}
STOCK = {"VLLM_PLUGINS": "lora_filesystem_resolver"}  # another plugin only

MI355X = [
    {"id": "mi355x_recipe", "env": AITER_ON, "engine": FP8},
    {
        "id": "b300_flags",
        "env": AITER_ON,
        "engine": {**FP8, "attention_config": FP8_INDEXER},
    },
    {"id": "public_mi355x_recipe", "env": {}, "engine": FP8},
    {
        "id": "public_mi355x_recipe_mtp",
        "env": {},
        "engine": {
            **FP8,
            "speculative_config": {"method": "mtp", "num_speculative_tokens": 1},
        },
    },
    {
        "id": "explicit_bf16_indexer",
        "env": AITER_ON,
        "engine": {**FP8, "attention_config": {"indexer_kv_dtype": "bf16"}},
    },
    {
        "id": "fp8_indexer_bf16_kv",
        "env": AITER_ON,
        "engine": {"max_model_len": 8192, "attention_config": FP8_INDEXER},
    },
    {"id": "bf16_everywhere", "env": {}, "engine": {"max_model_len": 8192}},
    {
        "id": "non_minimax_fp8",
        "env": {},
        "build": False,
        "engine": {**FP8, "model": "tests/data/llama_tiny"},
    },
]


@pytest.fixture(scope="module")
def mi355x(scenario_runner):
    return scenario_runner("mi355x", MI355X)


@pytest.fixture(scope="module")
def mi355x_stock(scenario_runner):
    scenarios = [s for s in MI355X if s["id"] in {"mi355x_recipe", "b300_flags"}]
    scenarios.append({"id": "public_mi355x_recipe", "env": {}, "engine": FP8})
    return scenario_runner("mi355x", scenarios, env=STOCK)


def assert_uniform(result: dict) -> None:
    assert "config_error" not in result and "build_error" not in result, result
    precisions = {tuple(spec[:2]) for spec in result["specs"].values()}
    assert precisions == {("torch.uint8", "FP8_PER_TENSOR")}, precisions
    for split in ("pp1", "pp2"):
        plan = result[split]
        assert plan["workers"] == [False] * len(plan["workers"]), (split, plan)
        assert plan["scheduler"] is False, (split, plan)
    # The indexer kernels still index e4m3 bytes, in the shape they always had.
    assert result["indexer_bound"]
    for dtype, shape in result["indexer_bound"].values():
        assert (dtype, shape) == ("torch.float8_e4m3fn", [2, 128, 128])


def plugin_error(result: dict) -> str:
    error = result.get("config_error")
    assert error is not None, f"expected a config-time error, got {result}"
    assert error["from_plugin"], error
    assert error["type"] == "IndexerPrecisionError"
    return error["message"]


def test_mi355x_recipe_inherits_fp8_and_is_uniform(mi355x):
    result = mi355x["mi355x_recipe"]
    assert result["indexer_kv_dtype"] == "fp8"
    assert result["indexer_impls"] == ["MiniMaxM3IndexerMSAImpl"]
    assert result["main_impls"] == ["MiniMaxM3SparseAiterPAImpl"]
    assert result["aiter_sparse_pa"] is True
    assert_uniform(result)


def test_b300_flags_on_mi355x_are_uniform(mi355x):
    result = mi355x["b300_flags"]
    assert result["indexer_kv_dtype"] == "fp8"
    assert_uniform(result)


def test_stock_vllm_mixes_precision_where_the_plugin_does_not(mi355x_stock):
    # Without the plugin the same flags leave the indexer bf16 (or, with the
    # B300 flags, fp8 described differently): workers want zeroing and the
    # scheduler's projection drops it; at PP=2 the stages disagree.
    for scenario in ("public_mi355x_recipe", "b300_flags"):
        plan = mi355x_stock[scenario]["pp1"]
        assert plan == {**plan, "workers": [True], "scheduler": False}, scenario
        assert mi355x_stock[scenario]["pp2"]["workers"] == [False, True]
    assert mi355x_stock["mi355x_recipe"]["build_error"]["type"] == "ValueError"


def test_plugin_excluded_by_vllm_plugins_changes_nothing(mi355x_stock):
    assert mi355x_stock["public_mi355x_recipe"]["indexer_kv_dtype"] == "auto"
    specs = mi355x_stock["b300_flags"]["specs"]
    assert ("torch.float8_e4m3fn", "NONE") in {tuple(s[:2]) for s in specs.values()}


def test_public_mi355x_recipe_runs_fp8_on_vllms_triton_indexer(mi355x):
    # AITER unset: the plugin's gate entry selects vLLM's Triton indexer for
    # the inherited fp8 index cache (no GPU here: its self-test says "not run").
    result = mi355x["public_mi355x_recipe"]
    assert result["indexer_kv_dtype"] == "fp8"
    assert result["indexer_impls"] == ["MiniMaxM3IndexerTritonImpl"]
    assert result["aiter_sparse_pa"] is False
    assert_uniform(result)


def test_public_mi355x_recipe_with_mtp_builds_the_drafter_on_the_same_indexer(
    mi355x,
):
    result = mi355x["public_mi355x_recipe_mtp"]
    assert result["indexer_kv_dtype"] == "fp8"
    assert result["draft_indexer_impls"] == ["MiniMaxM3IndexerTritonImpl"]
    assert_uniform(result)


def test_explicit_bf16_indexer_with_fp8_kv_is_an_error(mi355x):
    message = plugin_error(mi355x["explicit_bf16_indexer"])
    assert "indexer_kv_dtype='bf16'" in message
    assert "--attention-config.indexer_kv_dtype fp8" in message


def test_fp8_indexer_with_bf16_kv_is_an_error(mi355x):
    message = plugin_error(mi355x["fp8_indexer_bf16_kv"])
    assert "--kv-cache-dtype auto" in message
    assert "--kv-cache-dtype fp8" in message


def test_bf16_everywhere_is_unchanged(mi355x):
    result = mi355x["bf16_everywhere"]
    assert result["indexer_kv_dtype"] == "auto"
    assert result["indexer_impls"] == ["MiniMaxM3IndexerTritonImpl"]
    assert result["pp1"]["workers"] == [False]
    precisions = {tuple(spec[:2]) for spec in result["specs"].values()}
    assert precisions == {("torch.bfloat16", "NONE")}


def test_non_minimax_model_is_untouched(mi355x):
    result = mi355x["non_minimax_fp8"]
    assert "config_error" not in result, result
    assert result["indexer_kv_dtype"] == "auto"


# -- MI300X / MI325X (gfx942): no fp8 indexer exists ---------------------------


@pytest.fixture(scope="module")
def mi300x(scenario_runner):
    return scenario_runner(
        "mi300x",
        [
            {"id": "fp8_kv", "env": AITER_ON, "engine": FP8, "build": False},
            {
                "id": "fp8_both",
                "env": AITER_ON,
                "engine": {**FP8, "attention_config": FP8_INDEXER},
                "build": False,
            },
        ],
    )


def test_gfx942_fp8_kv_is_an_error_with_bf16_fallback(mi300x):
    message = plugin_error(mi300x["fp8_kv"])
    assert "gfx950" in message and "gfx942" in message
    assert "--kv-cache-dtype auto" in message
    # No env variable can give gfx942 an fp8 indexer, so none is offered.
    assert "VLLM_ROCM_USE_AITER=1" not in message.split("Fix with one of:")[1]


def test_gfx942_explicit_fp8_indexer_is_an_error(mi300x):
    message = plugin_error(mi300x["fp8_both"])
    assert "no fp8 indexer can run here" in message


# -- CUDA SM100 (B200/B300) ------------------------------------------------------


@pytest.fixture(scope="module")
def b300(scenario_runner):
    return scenario_runner(
        "b300",
        [
            {"id": "fp8_kv", "engine": FP8},
            {"id": "b300_recipe", "engine": {**FP8, "attention_config": FP8_INDEXER}},
        ],
    )


def test_sm100_inherits_fp8_and_is_uniform(b300):
    result = b300["fp8_kv"]
    assert result["indexer_kv_dtype"] == "fp8"
    assert result["indexer_impls"] == ["MiniMaxM3IndexerMSAImpl"]
    assert_uniform(result)


def test_sm100_b300_recipe_is_uniform(b300):
    assert_uniform(b300["b300_recipe"])
