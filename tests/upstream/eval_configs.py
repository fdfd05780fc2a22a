"""What vLLM would build from an eval config's server arguments.

``python -m tests.upstream.eval_configs --config F --out F`` reads one config
in vLLM's ``tests/evals/mrcr`` format, sets its ``env``, simulates the GPU
named by its file name (``_MI355``: gfx950), parses its ``server_args`` (plus
the two flags vLLM's harness adds) with ``vllm serve``'s own argument parser,
and builds the engine config for the MiniMax-M3 config this project bundles
(the named checkpoint's weights are not here), with whatever vLLM
``PYTHONPATH`` gives it and the plugin excluded. It writes the caches that
config resolves.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
from pathlib import Path

import yaml

HARNESS_FLAGS = ["--trust-remote-code", "--disable-uvicorn-access-log"]
"""What ``tests/evals/mrcr/test_mrcr_correctness.py`` appends to ``server_args``."""


def resolved(config_path: Path) -> dict[str, object]:
    from vllm_minimax_m3_kv_sim import engine as sim
    from vllm_minimax_m3_kv_sim.hardware import simulate

    config = yaml.safe_load(config_path.read_text())
    os.environ.update(config.get("env", {}))
    assert config_path.stem.endswith("_MI355"), config_path
    simulate("mi355x")

    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.entrypoints.common.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = make_arg_parser(FlexibleArgumentParser())
    server_args = shlex.split(config["server_args"])
    args = parser.parse_args(
        ["--model", sim.BUNDLED_MODEL, *server_args, *HARNESS_FLAGS]
    )
    engine_args = AsyncEngineArgs.from_cli_args(args)
    engine_args.skip_tokenizer_init = True
    # A reasoning parser is built with the tokenizer, which only the named
    # checkpoint has: check that vLLM knows the name, then build without it.
    from vllm.reasoning import ReasoningParserManager

    reasoning_parser = engine_args.reasoning_parser
    ReasoningParserManager.get_reasoning_parser(reasoning_parser)
    engine_args.reasoning_parser = ""
    vllm_config = engine_args.create_engine_config()
    return {
        "reasoning_parser": reasoning_parser,
        "kv_cache_dtype": vllm_config.cache_config.cache_dtype,
        "indexer_kv_dtype": vllm_config.attention_config.indexer_kv_dtype,
        "tensor_parallel_size": vllm_config.parallel_config.tensor_parallel_size,
        "max_model_len": vllm_config.model_config.max_model_len,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", required=True, type=Path)
    parser.add_argument("--out", required=True)
    options = parser.parse_args()
    Path(options.out).write_text(json.dumps(resolved(options.config)))


if __name__ == "__main__":
    sys.exit(main())
