"""Stock vLLM 0.33's own answer for a list of cells on one simulated node.

``python -m vllm_minimax_m3_kv_sim.programs.stock_cells GPU cells.json``: the
plugin is not loaded (``VLLM_PLUGINS`` must leave it out); each cell is
``{"env": {...}, "engine": {...}}`` (EngineArgs fields over the bundled
config); each answer ``{"starts", "mixed", "indexer_kv_dtype"}``, printed as
one JSON list. The harness's side of the plugin-off agreement test: it builds
from EngineArgs directly, where ``check`` parses a command line.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any


def answer(cell: dict[str, Any]) -> dict[str, Any]:
    from vllm_minimax_m3_kv_sim import engine as sim

    with sim.environment(cell["env"]):
        args = sim.make_engine_args({"model": sim.BUNDLED_MODEL, **cell["engine"]})
        try:
            config = args.create_engine_config()
            built = sim.build_model(config)
        except Exception as error:
            return {"starts": False, "error": f"{type(sim.unwrap(error)).__name__}"}
        stages = config.parallel_config.pipeline_parallel_size
        planned = sim.plan(config, sim.pp_stages(config, built, stages), 1 << 44)
    return {
        "starts": True,
        "mixed": any(planned["worker_mixed"]),
        "indexer_kv_dtype": config.attention_config.resolve_indexer_kv_dtype("bf16"),
    }


def main() -> None:
    from vllm_minimax_m3_kv.entrypoints.status import vllm_loads_this_plugin
    from vllm_minimax_m3_kv_sim.hardware import simulate

    assert not vllm_loads_this_plugin(), "VLLM_PLUGINS must leave the plugin out"
    simulate(sys.argv[1])
    cells = json.loads(Path(sys.argv[2]).read_text())
    print(json.dumps([answer(cell) for cell in cells]))


if __name__ == "__main__":
    main()
