"""What stock vLLM 0.33 does with a command, asked of stock vLLM itself.

With this plugin left out (``VLLM_PLUGINS``), ``check`` does not predict
stock's pool from rules of its own: a child process, with the plugin not
loaded and the target's platform simulated (:mod:`.target_platform`), runs
vLLM's config validation, builds the model on the meta device (where vLLM's
MiniMax-M3 code selects its indexer and refuses what it cannot run) and
plans the KV cache with vLLM's planner. Its answer is stock's, by
construction: a refusal in vLLM's words, or the specs' dtypes, whether
vLLM's workers and scheduler call the pool mixed, and its bytes per token.

A child because one process holds one platform and the plugin, once
registered, cannot be unloaded; the parent starts it before its own
judgement, so the two overlap.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from typing import Any

from vllm_minimax_m3_kv.config.targets import HERE
from vllm_minimax_m3_kv.entrypoints.check.arguments import CheckUsageError

_ANSWER = "stock-build-answer "
# Enough for any max_model_len: the planner refuses a pool that cannot hold
# one request, and capacity is not what this build is asked.
_PLANNING_BYTES = 1 << 44


@dataclass(frozen=True)
class StockBuild:
    """Stock vLLM 0.33's answer for one command on one target."""

    refused: str = ""
    """vLLM's own words where it refuses the command ("" where it starts)."""
    refused_at: str = ""
    """``config`` (vLLM's config validation) or ``model build``."""
    indexer_kv_dtype: str = ""
    """The index cache dtype vLLM resolves (``resolve_indexer_kv_dtype``)."""
    kinds: tuple[str, ...] = ()
    """Each (dtype, quantization mode) vLLM's specs hold: two or more is
    what vLLM calls a mixed pool."""
    workers_zero: tuple[bool, ...] = ()
    scheduler_zeroes: bool = False
    main_bytes: int = 0
    indexer_bytes: int = 0
    """Bytes per token on one rank, from the specs the layers returned."""

    @property
    def mixed(self) -> bool:
        return any(self.workers_zero)


def start(argv: list[str], target: str) -> subprocess.Popen[str]:
    """Start stock's build for check's ``argv`` (bundled model already in
    place of a missing one) in a child that inherits this environment."""
    env = dict(os.environ)
    # check runs on vLLM's CPU platform; the child is the target's.
    env.pop("VLLM_TARGET_DEVICE", None)
    child = subprocess.Popen(
        [sys.executable, "-m", __name__],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    assert child.stdin is not None
    child.stdin.write(json.dumps({"argv": argv, "target": target}))
    child.stdin.close()
    child.stdin = None  # written: communicate() only reads
    return child


def answer(child: subprocess.Popen[str]) -> StockBuild:
    """The child's answer; a usage error where it could not build at all."""
    stdout, stderr = child.communicate()
    for line in reversed(stdout.splitlines()):
        if line.startswith(_ANSWER):
            fields = json.loads(line[len(_ANSWER) :])
            return StockBuild(
                **{k: tuple(v) if isinstance(v, list) else v for k, v in fields.items()}
            )
    tail = (stderr.strip().splitlines() or ["no output"])[-1]
    raise CheckUsageError(
        f"stock vLLM 0.33's build of this command could not run here: {tail}"
    )


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
    print(_ANSWER + json.dumps(_build(request["argv"], request["target"])), flush=True)


if __name__ == "__main__":
    main()
