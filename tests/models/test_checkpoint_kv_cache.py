"""A checkpoint that declares its own fp8 KV cache, with no ``--kv-cache-dtype``.

llm-compressor's FP8 KV recipe (compressed-tensors ``kv_cache_scheme``) is
applied by vLLM 0.33 only in ``Attention.__init__``, at model build, after
every config hook; modelopt's ``kv_cache_quant_algo`` at config time. Each
scenario runs vLLM's config, the real MiniMax-M3 on the meta device (PP=2 also
as each stage's worker builds it, from its own copy of the config) and vLLM's
planner, with the plugin and without it (``VLLM_PLUGINS``).
"""

from __future__ import annotations

import pytest

from vllm_minimax_m3_kv_sim import engine as sim
from vllm_minimax_m3_kv_sim.environments import AITER_SPARSE_PA, STOCK_VLLM

OPT_IN = {"VLLM_MINIMAX_M3_KV_ALLOW_MIXED": "1"}
CT = {"model": sim.TINY_CT_FP8_KV, "max_model_len": 8192, "tensor_parallel_size": 4}
CT_SPARSE_FIRST = {**CT, "model": sim.TINY_CT_FP8_KV_SPARSE_FIRST}
FP8_INDEXER = {"attention_config": {"indexer_kv_dtype": "fp8"}}
BF16_INDEXER = {"attention_config": {"indexer_kv_dtype": "bf16"}}
SOURCE = (
    "quantization config declares an fp8 KV cache "
    "(compressed-tensors kv_cache_scheme), which vLLM applies to "
    "--kv-cache-dtype auto"
)
FP8_POOL = {("torch.uint8", "FP8_PER_TENSOR")}


def mi355x_scenarios(foreign: str | None = None) -> list[dict]:
    scenarios = [
        {"id": "ct", "env": AITER_SPARSE_PA, "engine": CT, "per_stage": True},
        {
            "id": "ct_sparse_first",
            "env": AITER_SPARSE_PA,
            "engine": CT_SPARSE_FIRST,
            "per_stage": True,
        },
        {
            "id": "ct_explicit_auto",
            "env": AITER_SPARSE_PA,
            "engine": {**CT, "kv_cache_dtype": "auto"},
        },
        {
            "id": "ct_fp8_indexer",
            "env": AITER_SPARSE_PA,
            "engine": {**CT, **FP8_INDEXER},
        },
        {"id": "ct_public_recipe", "env": {}, "engine": CT},
        {"id": "ct_bf16_indexer", "env": {}, "engine": {**CT, **BF16_INDEXER}},
        {"id": "ct_bf16", "env": {}, "engine": {**CT, "kv_cache_dtype": "bfloat16"}},
        {"id": "ct_opt_in", "env": OPT_IN, "engine": {**CT, **BF16_INDEXER}},
    ]
    if foreign is not None:
        scenarios.append(
            {
                "id": "ct_sparse_first_stock_stage",
                "env": AITER_SPARSE_PA,
                "engine": CT_SPARSE_FIRST,
                "foreign_pp2_stage": {"path": foreign, "stage": 0},
            }
        )
    return scenarios


@pytest.fixture(scope="module")
def stock_stages(tmp_path_factory) -> str:
    return str(tmp_path_factory.mktemp("stock") / "ct_sparse_first_pp2.pkl")


@pytest.fixture(scope="module")
def mi355x_stock(scenario_runner, stock_stages):
    scenarios = [
        {"id": "ct_public_recipe", "env": {}, "engine": CT, "per_stage": True},
        {
            "id": "ct_sparse_first",
            "env": {},
            "engine": CT_SPARSE_FIRST,
            "dump_pp2_stages": stock_stages,
        },
        {
            "id": "ct_fp8_indexer",
            "env": AITER_SPARSE_PA,
            "engine": {**CT, **FP8_INDEXER},
        },
    ]
    return scenario_runner("mi355x", scenarios, env=STOCK_VLLM)


@pytest.fixture(scope="module")
def mi355x(scenario_runner, mi355x_stock, stock_stages):
    # After the stock child: one scenario plans with a stage it built.
    return scenario_runner("mi355x", mi355x_scenarios(stock_stages))


SM100 = [
    {
        "id": "modelopt",
        "engine": {"model": sim.TINY_MODELOPT_FP8, "max_model_len": 8192},
        "per_stage": True,
    },
    {"id": "ct", "engine": CT, "per_stage": True},
]


@pytest.fixture(scope="module")
def sm100(scenario_runner):
    return scenario_runner("b300", SM100)


@pytest.fixture(scope="module")
def sm100_stock(scenario_runner):
    return scenario_runner("b300", SM100[:1], env=STOCK_VLLM)


def precisions(specs: dict) -> set[tuple[str, str]]:
    return {tuple(spec[:2]) for spec in specs.values()}


def assert_uniform_fp8(result: dict) -> None:
    assert "config_error" not in result and "build_error" not in result, result
    assert result["kv_cache_dtype"] in ("fp8", "fp8_e4m3")
    assert result["indexer_kv_dtype"] == "fp8"
    assert precisions(result["specs"]) == FP8_POOL
    plans = ["pp1", "pp2"] + (["pp2_per_stage"] if "pp2_per_stage" in result else [])
    for split in plans:
        plan = result[split]
        assert not any(plan["workers"]) and plan["scheduler"] is False, (split, plan)
    for stage in result.get("pp2_stage_specs", []):
        assert stage and precisions(stage) == FP8_POOL, stage
    assert not result["plan_warnings"], result["plan_warnings"]


def plugin_refusal(result: dict) -> str:
    error = result.get("config_error")
    assert error is not None and error["from_plugin"], result
    return error["message"]


def test_stock_mixes_what_the_checkpoint_declares(mi355x_stock):
    # The failure the resolver exists for: stock's config says auto, model
    # build makes the dense layers fp8 beside a bf16 index cache; a stage
    # with no dense layer keeps bf16 for everything.
    public = mi355x_stock["ct_public_recipe"]
    assert public["kv_cache_dtype"] == "auto"
    assert precisions(public["specs"]) == {*FP8_POOL, ("torch.bfloat16", "NONE")}
    assert public["pp1"]["workers"] == [True] and public["pp1"]["scheduler"] is False
    stage0, stage1 = public["pp2_stage_specs"]
    assert precisions(stage0) == FP8_POOL
    assert precisions(stage1) == {("torch.bfloat16", "NONE")}
    # Sparse layers built before the first dense one keep the model dtype.
    sparse_first = mi355x_stock["ct_sparse_first"]["specs"]
    main = {n: s for n, s in sparse_first.items() if not n.endswith("index_cache")}
    assert precisions(main) == {*FP8_POOL, ("torch.bfloat16", "NONE")}


@pytest.mark.parametrize("scenario", ["ct", "ct_sparse_first", "ct_explicit_auto"])
def test_checkpoint_fp8_kv_cache_is_inherited_and_uniform(mi355x, scenario):
    result = mi355x[scenario]
    assert_uniform_fp8(result)
    assert result["kv_cache_dtype"] == "fp8"
    assert result["indexer_impls"] == ["MiniMaxM3IndexerMSAImpl"]


def test_explicit_fp8_indexer_beside_a_checkpoint_fp8_cache_is_uniform(
    mi355x, mi355x_stock
):
    assert_uniform_fp8(mi355x["ct_fp8_indexer"])
    # Stock runs the same flags mixed: its fp8 index cache is described
    # (float8_e4m3fn, NONE), unlike the main cache.
    stock = mi355x_stock["ct_fp8_indexer"]
    assert stock["pp1"]["workers"] == [True] and stock["pp1"]["scheduler"] is False


def test_checkpoint_fp8_on_the_public_recipe_runs_vllms_triton_indexer(mi355x):
    # AITER unset: the declared fp8 cache and an inherited fp8 index cache.
    result = mi355x["ct_public_recipe"]
    assert result["indexer_impls"] == ["MiniMaxM3IndexerTritonImpl"]
    assert_uniform_fp8(result)


def test_checkpoint_fp8_beside_a_bf16_indexer_is_refused_with_working_fixes(
    mi355x,
):
    message = plugin_refusal(mi355x["ct_bf16_indexer"])
    assert SOURCE in message
    assert "--attention-config.indexer_kv_dtype fp8" in message
    # "auto" is this checkpoint's fp8: the bf16 fix must say bfloat16.
    fixes = message.split("Fix with one of:", 1)[1]
    assert "--kv-cache-dtype bfloat16" in fixes
    assert "--kv-cache-dtype auto" not in fixes
    # The fixes, applied, start: an fp8 indexer is "ct_fp8_indexer"; bfloat16:
    bf16 = mi355x["ct_bf16"]
    assert precisions(bf16["specs"]) == {("torch.bfloat16", "NONE")}
    assert not any(bf16["pp1"]["workers"]) and not bf16["pp1"]["scheduler"]


def test_opt_in_runs_the_checkpoint_fp8_cache_mixed_with_zeroing(mi355x):
    result = mi355x["ct_opt_in"]
    assert result["kv_cache_dtype"] == "fp8"
    for split in ("pp1", "pp2"):
        plan = result[split]
        assert all(plan["workers"]) and plan["scheduler"] is True, (split, plan)


def test_planning_warns_when_the_pool_is_not_the_predicted_one(mi355x):
    # Stage 0's specs from a node without the plugin (its sparse layers built
    # bf16 before the first dense layer): the decision predicted one fp8
    # precision, the planner sees three, and every worker zeroes.
    result = mi355x["ct_sparse_first_stock_stage"]
    plan = result["pp2_foreign"]
    assert all(plan["workers"]) and plan["scheduler"] is True, plan
    (warning,) = result["pp2_foreign_warnings"]
    assert "predicted one precision: main cache fp8_e4m3, index cache fp8" in warning
    assert "planned bfloat16/NONE, uint8/FP8_PER_TENSOR;" in warning
    assert "every one of 2 workers and the scheduler zero" in warning


@pytest.mark.parametrize("scenario", ["modelopt", "ct"])
def test_sm100_checkpoint_fp8_kv_cache_is_uniform(sm100, scenario):
    assert_uniform_fp8(sm100[scenario])


def test_sm100_stock_modelopt_is_mixed(sm100_stock):
    stock = sm100_stock["modelopt"]
    assert stock["kv_cache_dtype"] == "fp8_e4m3"
    assert stock["pp1"]["workers"] == [True] and stock["pp1"]["scheduler"] is False
