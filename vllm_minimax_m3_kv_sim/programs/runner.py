"""Run MiniMax-M3 scenarios through real vLLM 0.33 on a simulated platform.

``python -m vllm_minimax_m3_kv_sim.programs.runner --platform mi355x --scenarios in.json --out out.json``

Each scenario goes through ``EngineArgs(...).create_engine_config()`` (vLLM
loads this plugin from its entry point there, as ``vllm serve`` does), then
optionally builds the real MiniMax-M3 model on the meta device and runs vLLM's
KV planner on the specs its layers return, for PP=1 and a PP=2 stage split
(optionally with one stage's specs from another process, e.g. one without the
plugin, as a node of a multi-node engine would send them).
"""

from __future__ import annotations

import argparse
import json
import logging
import pickle
import sys
import traceback
from pathlib import Path
from typing import Any

from vllm_minimax_m3_kv_sim import engine as sim
from vllm_minimax_m3_kv_sim.hardware import simulate


class _PluginWarnings(logging.Handler):
    """The plugin's WARNING lines, as an operator would read them in a log."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


_warnings = _PluginWarnings()


def _listen_to_the_plugin(args: Any) -> None:
    # create_engine_config applies vLLM's logging config first, which drops
    # handlers under "vllm"; apply it now (it is not applied twice), then
    # listen.
    from vllm.logger import configure_logging_if_needed

    configure_logging_if_needed(args.create_logging_config())
    plugin_logger = logging.getLogger("vllm.vllm_minimax_m3_kv")
    if _warnings not in plugin_logger.handlers:
        plugin_logger.addHandler(_warnings)


def _pool_layers(vllm_config: Any) -> dict[str, list[int]]:
    """Which layers the plugin's facts say hold what (to compare with the
    specs vLLM's layers return)."""
    from vllm_minimax_m3_kv.config.facts import live_facts

    facts = live_facts(vllm_config)
    return {
        "sparse": sorted(facts.layers.sparse),
        "unquantized_dense": list(facts.unquantized_dense_layers),
        "skip_ignored": list(facts.layers.skip_ignored),
    }


def _modules_entered(call: Any, functions: bool = False) -> list[str]:
    """The plugin modules ``call`` enters, in order: one entry each time
    control passes into a module from another (returns are not entries;
    dataclass-generated methods belong to their caller); with
    ``functions``, as ``module:function``."""
    entered: list[str] = []

    def profile(frame: Any, event: str, _: Any) -> None:
        if event != "call" or frame.f_code.co_filename == "<string>":
            return
        module = frame.f_globals.get("__name__", "")
        caller = frame.f_back
        while caller is not None and caller.f_code.co_filename == "<string>":
            caller = caller.f_back
        came_from = caller.f_globals.get("__name__", "") if caller else ""
        if module.startswith("vllm_minimax_m3_kv") and module != came_from:
            entered.append(f"{module}:{frame.f_code.co_name}" if functions else module)

    sys.setprofile(profile)
    try:
        call()
    finally:
        sys.setprofile(None)
    return entered


def _fact_walk(vllm_config: Any) -> dict[str, Any]:
    """How gathering the policy's facts walks the plugin's modules, on a
    fresh copy of the model config (nothing cached) and then again."""
    import copy

    from vllm_minimax_m3_kv.config.facts import live_facts, model_facts

    fresh = copy.copy(vllm_config)
    fresh.model_config = copy.copy(vllm_config.model_config)
    cold = _modules_entered(lambda: live_facts(fresh))
    warm = _modules_entered(lambda: live_facts(fresh))
    return {
        "cold": cold,
        "warm": warm,
        "same_facts": live_facts(fresh) == live_facts(vllm_config),
        "model_facts_kept": model_facts(fresh.model_config)
        is model_facts(fresh.model_config),
    }


def run_scenario(scenario: dict[str, Any]) -> dict[str, Any]:
    import vllm.logger

    result: dict[str, Any] = {"id": scenario["id"]}
    _warnings.messages.clear()
    # Each scenario is its own server log: a warning logged once per process
    # by an earlier scenario must show again.
    vllm.logger._print_warning_once.cache_clear()
    with sim.environment(scenario.get("env", {})):
        try:
            args = sim.make_engine_args(
                scenario.get("engine", {}), scenario.get("set_backend", True)
            )
            _listen_to_the_plugin(args)
            vllm_config = args.create_engine_config()
        except Exception as error:
            result["config_error"] = sim.describe_error(error)
            return result
        finally:
            result["plugin_warnings"] = list(_warnings.messages)
        if "cache_dtype_after_decision" in scenario:
            # Changed after the hook decided, then sent on as vLLM sends the
            # config to its engine core and workers (pickled): what runs
            # later must follow the decision, not re-read the changed value.
            vllm_config.cache_config.cache_dtype = scenario[
                "cache_dtype_after_decision"
            ]
            vllm_config = pickle.loads(pickle.dumps(vllm_config))
        result["kv_cache_dtype"] = vllm_config.cache_config.cache_dtype
        result["indexer_kv_dtype"] = vllm_config.attention_config.indexer_kv_dtype
        if vllm_config.model_config.architecture.startswith("MiniMaxM3"):
            result["pool_layers"] = _pool_layers(vllm_config)
            if scenario.get("fact_walk"):
                result["fact_walk"] = _fact_walk(vllm_config)
        if not scenario.get("build", True):
            return result
        if scenario.get("walk_after_decision"):
            # Which plugin modules the model build and KV planning enter, on
            # a copy of the config as a worker receives it (a model registers
            # its layers in the config it is built under).
            sent = pickle.loads(pickle.dumps(vllm_config))
            result["after_decision_walk"] = _modules_entered(
                lambda: sim.plan(sent, [sim.build_model(sent).specs]), functions=True
            )
        try:
            built = sim.build_model(vllm_config, bind_indexer=True)
        except Exception as error:
            result["build_error"] = sim.describe_error(error)
            result["build_traceback"] = traceback.format_exc(limit=3)
            return result
        result.update(built.selected)
        result["specs"] = sim.spec_summary(built.specs)
        _warnings.messages.clear()
        result["pp1"] = sim.plan(vllm_config, [built.specs])
        stages = sim.pp_stages(vllm_config, built, 2)
        result["pp2"] = sim.plan(vllm_config, stages)
        if scenario.get("per_stage"):
            # As PP workers do: each builds its own stage from its own copy
            # of the config the engine sent (see vllm_minimax_m3_kv_sim.engine.build_model).
            pp2_config = sim.make_engine_args(
                {**scenario.get("engine", {}), "pipeline_parallel_size": 2},
                scenario.get("set_backend", True),
            ).create_engine_config()
            own = [sim.build_model(pp2_config, pp_rank=rank) for rank in (0, 1)]
            result["pp2_stage_specs"] = [sim.spec_summary(b.specs) for b in own]
            result["pp2_per_stage"] = sim.plan(pp2_config, [b.specs for b in own])
        result["plan_warnings"] = list(_warnings.messages)
        if "dump_pp2_stages" in scenario:  # for another process to plan with
            Path(scenario["dump_pp2_stages"]).write_bytes(pickle.dumps(stages))
        if "foreign_pp2_stage" in scenario:
            # One stage's specs as a process without this plugin built them.
            foreign = scenario["foreign_pp2_stage"]
            theirs = pickle.loads(Path(foreign["path"]).read_bytes())
            stages[foreign["stage"]] = theirs[foreign["stage"]]
            _warnings.messages.clear()
            try:
                result["pp2_foreign"] = sim.plan(vllm_config, stages)
            except Exception as error:
                result["pp2_foreign_error"] = sim.describe_error(error)
            result["pp2_foreign_warnings"] = list(_warnings.messages)
    return result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--platform", required=True)
    parser.add_argument("--scenarios", required=True)
    parser.add_argument("--out", required=True)
    options = parser.parse_args()
    simulate(options.platform)
    scenarios = json.loads(Path(options.scenarios).read_text())
    results = [run_scenario(scenario) for scenario in scenarios]
    Path(options.out).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    sys.exit(main())
