"""A multi-node engine where one node lacks the plugin must not run mixed.

One child process builds MiniMax-M3 without the plugin (``VLLM_PLUGINS``
excluding it) and writes its PP stages' specs, as that node's worker would
send them; another, with the plugin, plans its own stage beside the foreign
one, as the engine core plans every worker's specs.
"""

from __future__ import annotations

import pytest

from vllm_minimax_m3_kv_sim.environments import AITER_SPARSE_PA, STOCK_VLLM

# The B300 recipe's flags (explicit fp8 indexer), so both nodes agree on the
# indexer dtype and differ only in how they describe its cache.
RECIPE = {
    "kv_cache_dtype": "fp8",
    "tensor_parallel_size": 8,
    "pipeline_parallel_size": 2,
    "attention_config": {"indexer_kv_dtype": "fp8"},
}


@pytest.fixture(scope="module")
def planned(scenario_runner, tmp_path_factory):
    dump = str(tmp_path_factory.mktemp("stages") / "stock_stages.pkl")
    stock = scenario_runner(
        "mi355x",
        [
            {
                "id": "stock",
                "env": AITER_SPARSE_PA,
                "engine": RECIPE,
                "dump_pp2_stages": dump,
            }
        ],
        env=STOCK_VLLM,
    )
    assert "pp2" in stock["stock"], stock
    return scenario_runner(
        "mi355x",
        [
            {
                "id": f"foreign_stage_{stage}",
                "env": AITER_SPARSE_PA,
                "engine": RECIPE,
                "foreign_pp2_stage": {"path": dump, "stage": stage},
            }
            for stage in (0, 1)
        ],
    )


def test_stage_from_a_node_without_the_plugin_fails_startup_naming_it(planned):
    # Stage 1 holds the index caches (the checkpoint's sparse layers are last).
    error = planned["foreign_stage_1"]["pp2_foreign_error"]
    assert error["type"] == "PartialInstallError"
    assert "worker 1 (pipeline stage 1 of 2)" in error["message"]
    assert "float8_e4m3fn/NONE" in error["message"]
    assert "pip install --no-deps /path/to/vllm-minimax-m3-kv" in error["message"]


def test_stage_without_index_caches_is_the_same_either_way(planned):
    # Stage 0 has no sparse layers: both nodes describe it alike, and the
    # pool is uniform; nothing to detect and nothing mixed.
    result = planned["foreign_stage_0"]
    assert "pp2_foreign_error" not in result, result
    plan = result["pp2_foreign"]
    assert plan["workers"] == [False, False] and plan["scheduler"] is False
