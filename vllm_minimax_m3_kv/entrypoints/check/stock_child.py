"""The child :mod:`.stock_build` starts: stock vLLM 0.33's own build of one
command on one target, this plugin not loaded (``VLLM_PLUGINS`` leaves it out).

``python -m vllm_minimax_m3_kv.entrypoints.check.stock_child`` reads
``{"argv", "target"}`` on stdin and writes one :data:`.stock_build.ANSWER`
line: the target's platform simulated first (one platform per process), then
vLLM's config validation, its model build on the meta device and its KV
planner.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from vllm_minimax_m3_kv.config.targets import HERE
from vllm_minimax_m3_kv.entrypoints.check.stock_build import ANSWER
from vllm_minimax_m3_kv.entrypoints.output import Output

# Enough for any max_model_len: the planner refuses a pool that cannot hold
# one request, and capacity is not what this build is asked.
_PLANNING_BYTES = 1 << 44


def _build(argv: list[str], target: str) -> dict[str, Any]:
    from vllm_minimax_m3_kv.entrypoints.check.judge import (
        engine_args_for,
        validation_words,
    )

    if target != HERE:
        from vllm_minimax_m3_kv.entrypoints.check.target_platform import simulate

        # The target's image ships aiter with its MSA kernels (as check
        # assumes for the plugin's verdict); the variables come from the env.
        simulate(target, "msa")
    from vllm.config import set_current_vllm_config
    from vllm.v1.core.kv_cache_utils import generate_scheduler_kv_cache_config

    from vllm_minimax_m3_kv.entrypoints.check.arguments import build_parser
    from vllm_minimax_m3_kv.entrypoints.check.vllm_build import (
        ATTENTION_BACKEND_ON_CPU,
        build_model,
        kv_cache_configs,
        pp_stages,
    )

    engine_args, _ = engine_args_for(build_parser().parse_args(argv))
    # Neither changes a KV spec: backend discovery and compilation would
    # import GPU kernels on this CPU.
    engine_args.attention_backend = (
        engine_args.attention_backend or ATTENTION_BACKEND_ON_CPU
    )
    engine_args.enforce_eager = True
    try:
        config = engine_args.create_engine_config()
    except Exception as error:
        return {"refused": validation_words(error), "refused_at": "config"}
    try:
        built = build_model(config)
    except (ValueError, NotImplementedError) as error:
        # vLLM's MiniMax-M3 code refusing what it cannot run on this GPU.
        return {
            "refused": f"{type(error).__name__}: {error}",
            "refused_at": "model build",
        }
    stages = pp_stages(config, built, config.parallel_config.pipeline_parallel_size)
    configs = kv_cache_configs(config, stages, _PLANNING_BYTES)
    with set_current_vllm_config(config):
        scheduler = generate_scheduler_kv_cache_config(configs)
    main = indexer = 0
    for name, spec in built.specs.items():
        if name in built.draft_layers:
            continue
        per_token = spec.page_size_bytes // spec.block_size
        if name.endswith("index_cache"):
            indexer += per_token
        else:
            main += per_token
    kinds = {
        f"{str(spec.dtype).removeprefix('torch.')} {spec.kv_quant_mode.name}"
        for spec in built.specs.values()
    }
    return {
        "indexer_kv_dtype": config.attention_config.resolve_indexer_kv_dtype("bf16"),
        "kinds": sorted(kinds),
        "workers_zero": [c.needs_kv_cache_zeroing for c in configs],
        "scheduler_zeroes": scheduler.needs_kv_cache_zeroing,
        "main_bytes": main,
        "indexer_bytes": indexer,
    }


def main() -> None:
    request = json.loads(sys.stdin.read())
    Output().text(
        ANSWER + json.dumps(_build(request["argv"], request["target"])) + "\n"
    )


if __name__ == "__main__":
    main()
