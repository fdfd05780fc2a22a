"""End to end on real vLLM 0.33: config -> MiniMax-M3 on meta -> KV planner.

Every scenario goes through ``EngineArgs(...).create_engine_config()`` with the
plugin loaded from its entry point, on a simulated MI355X, MI300X or B300. The
"stock" scenarios exclude the plugin with ``VLLM_PLUGINS`` and show the failure
the plugin exists for, so the uniform results below are not vacuous.
"""

from __future__ import annotations

import pytest

from vllm_minimax_m3_kv_sim.environments import AITER_SPARSE_PA, STOCK_VLLM

FP8 = {"kv_cache_dtype": "fp8", "max_model_len": 8192}
FP8_INDEXER = {"indexer_kv_dtype": "fp8"}

MI355X = [
    {"id": "mi355x_recipe", "env": AITER_SPARSE_PA, "engine": FP8},
    {
        "id": "b300_flags",
        "env": AITER_SPARSE_PA,
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
        "env": AITER_SPARSE_PA,
        "engine": {**FP8, "attention_config": {"indexer_kv_dtype": "bf16"}},
    },
    {
        "id": "fp8_indexer_bf16_kv",
        "env": AITER_SPARSE_PA,
        "engine": {"max_model_len": 8192, "attention_config": FP8_INDEXER},
    },
    {"id": "bf16_everywhere", "env": {}, "engine": {"max_model_len": 8192}},
    {
        "id": "bf16_aiter_sparse_pa_tp2",
        "env": AITER_SPARSE_PA,
        "engine": {"max_model_len": 8192, "tensor_parallel_size": 2},
    },
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
    return scenario_runner("mi355x", scenarios, env=STOCK_VLLM)


E4M3FN, E4M3FNUZ = "torch.float8_e4m3fn", "torch.float8_e4m3fnuz"


def assert_uniform(result: dict, fp8: str = E4M3FN) -> None:
    assert "config_error" not in result and "build_error" not in result, result
    precisions = {tuple(spec[:2]) for spec in result["specs"].values()}
    assert precisions == {("torch.uint8", "FP8_PER_TENSOR")}, precisions
    for split in ("pp1", "pp2"):
        plan = result[split]
        assert plan["workers"] == [False] * len(plan["workers"]), (split, plan)
        assert plan["scheduler"] is False, (split, plan)
    # The indexer kernels index the platform's e4m3 bytes, in the shape they
    # always had.
    assert result["indexer_bound"]
    for dtype, shape in result["indexer_bound"].values():
        assert (dtype, shape) == (fp8, [2, 128, 128])


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


def test_a_bf16_pool_with_aiter_sparse_pa_at_two_heads_per_rank_fails_in_vllm(mi355x):
    # What check reports for this command (tests/entrypoints/test_check.py):
    # the plugin leaves the bf16 pool alone, and vLLM's own model build fails.
    result = mi355x["bf16_aiter_sparse_pa_tp2"]
    assert "config_error" not in result, result
    assert result["indexer_kv_dtype"] == "auto"
    error = result["build_error"]
    assert (
        "requires num_kv_heads == 1 per tensor-parallel rank, got 2"
        in (error["message"])
    ), error


def test_non_minimax_model_is_untouched(mi355x):
    result = mi355x["non_minimax_fp8"]
    assert "config_error" not in result, result
    assert result["indexer_kv_dtype"] == "auto"


# -- MI300X / MI325X (gfx942): an fnuz index cache, the plugin's writer ---------

MTP = {"speculative_config": {"method": "mtp", "num_speculative_tokens": 1}}


@pytest.fixture(scope="module")
def mi300x(scenario_runner):
    return scenario_runner(
        "mi300x",
        [
            {"id": "fp8_kv", "env": {}, "engine": FP8},
            {"id": "fp8_kv_mtp", "env": {}, "engine": {**FP8, **MTP}},
            {
                "id": "fp8_both",
                "env": {},
                "engine": {**FP8, "attention_config": FP8_INDEXER},
            },
            {
                "id": "fp8_kv_aiter_only",
                "env": {"VLLM_ROCM_USE_AITER": "1"},
                "engine": {**FP8, "tensor_parallel_size": 4},
            },
            {
                "id": "fp8_kv_aiter_sparse_pa",
                "env": AITER_SPARSE_PA,
                "engine": {**FP8, "tensor_parallel_size": 4},
            },
        ],
    )


@pytest.fixture(scope="module")
def mi300x_stock(scenario_runner):
    return scenario_runner(
        "mi300x",
        [
            {"id": "fp8_kv", "env": STOCK_VLLM, "engine": FP8},
            {
                "id": "fp8_both",
                "env": STOCK_VLLM,
                "engine": {**FP8, "attention_config": FP8_INDEXER},
            },
        ],
    )


def test_gfx942_fp8_kv_gets_an_fnuz_index_cache_on_vllms_triton_indexer(mi300x):
    for scenario in ("fp8_kv", "fp8_both", "fp8_kv_aiter_only"):
        result = mi300x[scenario]
        assert result["indexer_kv_dtype"] == "fp8", scenario
        assert result["indexer_impls"] == ["MiniMaxM3IndexerTritonImpl"], scenario
        # Index cache and query in vLLM's fp8 type for gfx942, like the main
        # cache, and written by the plugin's writer, not the fused op's OCP store.
        assert result["index_cache_dtypes"] == ["torch.float8_e4m3fnuz"], scenario
        assert result["index_writer"] == "OpsWithFnuzIndexWriter", scenario
        assert_uniform(result, fp8=E4M3FNUZ)


def test_gfx942_beside_aiter_sparse_pa_is_refused_with_the_layout_fix(mi300x):
    # There AITER's kernels, not the plugin's writer, would write the fnuz
    # index cache, and nothing checks those bytes.
    message = plugin_error(mi300x["fp8_kv_aiter_sparse_pa"])
    assert "would be written by AITER's kernels" in message
    assert "VLLM_ROCM_SHUFFLE_KV_CACHE_LAYOUT=0" in message


def test_gfx942_mtp_drafter_builds_on_the_same_indexer(mi300x):
    result = mi300x["fp8_kv_mtp"]
    assert result["draft_indexer_impls"] == ["MiniMaxM3IndexerTritonImpl"]
    assert result["index_cache_dtypes"] == ["torch.float8_e4m3fnuz"]
    assert_uniform(result, fp8=E4M3FNUZ)


def test_stock_vllm_on_gfx942_mixes_or_fails(mi300x_stock):
    # What the plugin changes: stock leaves the index cache bf16 beside the
    # fnuz main cache (a mixed pool), and refuses an fp8 one at model build.
    plan = mi300x_stock["fp8_kv"]["pp1"]
    assert plan == {**plan, "workers": [True], "scheduler": False}
    assert mi300x_stock["fp8_kv"]["index_writer"] == "module"
    error = mi300x_stock["fp8_both"]["build_error"]
    assert "requires CUDA fp8 support" in error["message"], error


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
