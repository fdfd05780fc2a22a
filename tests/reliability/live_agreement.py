"""Hypothesis: the live config hook and ``decide()`` on a named target agree.

``python -m tests.reliability.live_agreement --platform mi355x --examples 150``
draws flag sets (every KV dtype in vLLM's ``KV_CACHE_DTYPES``, indexer dtype,
TP, indexer CP, max_model_len, checkpoint variant, skip layers, AITER
variables, the mixed-pool opt-in) and, in this process on the simulated platform, runs
``create_engine_config`` with the plugin loaded; the offline path (what
``check --target`` calls) must reach the same verdict from the same facts.
Exits non-zero with hypothesis' falsifying example on any disagreement.
"""

from __future__ import annotations

import argparse
import json
import sys

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.reliability.matrix import (
    ALLOW_MIXED,
    CHECKPOINTS,
    INDEXER_KV_DTYPES,
    LONG_CONTEXT_ENV,
    MAX_MODEL_LENS,
    SKIP_LAYERS,
    vllm_kv_cache_dtypes,
)
from vllm_minimax_m3_kv_sim import engine as sim
from vllm_minimax_m3_kv_sim.hardware import simulate


def flag_sets() -> st.SearchStrategy[dict]:
    """Drawn after the platform is simulated, so its own KV dtypes count."""
    return st.fixed_dictionaries(
        {
            "kv": st.sampled_from(vllm_kv_cache_dtypes()),
            "indexer": st.sampled_from(INDEXER_KV_DTYPES),
            "tp": st.sampled_from([1, 2, 4, 8]),
            "cp": st.booleans(),
            "max_model_len": st.sampled_from(MAX_MODEL_LENS),
            "checkpoint": st.sampled_from(sorted(CHECKPOINTS)),
            "skip_layers": st.sampled_from(SKIP_LAYERS),
            "aiter": st.booleans(),
            "shuffle": st.booleans(),
            "allow_mixed": st.booleans(),
        }
    )


def _engine(flags: dict) -> dict:
    attention = {"minimax_m3_indexer_cp": flags["cp"]}
    if flags["indexer"] is not None:
        attention["indexer_kv_dtype"] = flags["indexer"]
    return {
        "model": CHECKPOINTS[flags["checkpoint"]],
        "kv_cache_dtype": flags["kv"],
        "kv_cache_dtype_skip_layers": list(flags["skip_layers"]),
        "tensor_parallel_size": flags["tp"],
        "max_model_len": flags["max_model_len"],
        "attention_config": attention,
    }


def live(flags: dict) -> tuple[str, object]:
    """What the plugin, loaded by vLLM, made of these flags."""
    try:
        config = sim.make_engine_args(_engine(flags)).create_engine_config()
    except Exception as error:
        inner = sim.unwrap(error)
        verdict = getattr(inner, "verdict", None)
        if verdict is None:
            return "vllm_error", type(inner).__name__
        return "error", verdict.fixes
    return "runs", config.attention_config.indexer_kv_dtype


def offline(flags: dict, target: str) -> tuple[str, object]:
    """The same question asked the way ``check --target`` asks it: the hook
    judges for the named target while vLLM resolves the config."""
    from vllm_minimax_m3_kv.config.targets import judging_for
    from vllm_minimax_m3_kv.config.verdicts import Outcome

    with judging_for(target) as judgement:
        try:
            sim.make_engine_args(_engine(flags)).create_engine_config()
        except Exception as error:
            if getattr(sim.unwrap(error), "verdict", None) is None:
                raise
    verdict = judgement.verdict
    assert verdict is not None, "the hook never ran"
    if verdict.outcome is Outcome.ERROR:
        return "error", verdict.fixes
    if verdict.outcome is Outcome.MIXED:
        return "mixed", verdict.indexer_kv_dtype
    return "runs", verdict.indexer_kv_dtype


def check_platform(platform: str, examples: int) -> dict[str, int]:
    """Outcomes seen, by kind; raises on the first disagreement."""
    simulate(platform)
    tally = {"runs": 0, "mixed": 0, "error": 0, "vllm_error": 0}

    @settings(
        max_examples=examples,
        deadline=None,
        derandomize=True,
        suppress_health_check=list(HealthCheck),
    )
    @given(flag_sets())
    def agree(flags: dict) -> None:
        name, value = ALLOW_MIXED
        env = {
            "VLLM_ROCM_USE_AITER": str(int(flags["aiter"])),
            "VLLM_ROCM_SHUFFLE_KV_CACHE_LAYOUT": str(int(flags["shuffle"])),
            name: value if flags["allow_mixed"] else None,
            **LONG_CONTEXT_ENV,
        }
        with sim.environment(env):
            seen = live(flags)
            tally[seen[0]] += 1
            if seen[0] == "vllm_error":
                return  # vLLM's own validation refused the flags
            expected = offline(flags, platform)
            if expected[0] == "mixed":
                tally["mixed"] += 1
                expected = ("runs", expected[1])
            assert seen == expected, (flags, seen)

    agree()
    return tally


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--platform", required=True)
    parser.add_argument("--examples", type=int, default=150)
    options = parser.parse_args()
    print(json.dumps(check_platform(options.platform, options.examples)))


if __name__ == "__main__":
    sys.exit(main())
