"""How the policy's facts are gathered from a real vLLM 0.33 engine config:
in one pass over the plugin's modules, the model's facts read once per
``ModelConfig`` object (``vllm_minimax_m3_kv_sim/programs/runner.py``'s ``fact_walk``)."""

from __future__ import annotations

from collections import Counter

import pytest

from vllm_minimax_m3_kv_sim import engine as sim
from vllm_minimax_m3_kv_sim.environments import AITER_SPARSE_PA

FACTS = "vllm_minimax_m3_kv.config.facts"
KV_CACHE_DTYPE = "vllm_minimax_m3_kv.config.kv_cache_dtype"
ENGINES = {
    "bundled_fp8": {"model": sim.BUNDLED_MODEL, "kv_cache_dtype": "fp8"},
    "ct_checkpoint": {"model": sim.TINY_CT_FP8_KV, "max_model_len": 8192},
    "modelopt_checkpoint": {"model": sim.TINY_MODELOPT_FP8, "max_model_len": 8192},
    "mtp_pp2": {
        "model": sim.TINY_MODEL,
        "kv_cache_dtype": "fp8",
        "pipeline_parallel_size": 2,
        "speculative_config": {"method": "mtp", "num_speculative_tokens": 1},
    },
}


@pytest.fixture(scope="module")
def walks(scenario_runner):
    scenarios = [
        {
            "id": name,
            "env": AITER_SPARSE_PA,
            "engine": engine,
            "build": False,
            "fact_walk": True,
        }
        for name, engine in ENGINES.items()
    ]
    return scenario_runner("mi355x", scenarios)


@pytest.mark.parametrize("engine", list(ENGINES))
def test_gathering_enters_each_plugin_module_once(walks, engine):
    result = walks[engine]
    assert "config_error" not in result, result
    walk = result["fact_walk"]
    entered_twice = [m for m, n in Counter(walk["cold"]).items() if n > 1]
    assert not entered_twice, walk["cold"]
    assert walk["cold"][0] == FACTS
    # The checkpoint is read where vLLM reads it, once per model config.
    assert KV_CACHE_DTYPE in walk["cold"]
    assert KV_CACHE_DTYPE not in walk["warm"], walk["warm"]
    assert walk["model_facts_kept"]
    assert walk["same_facts"]
