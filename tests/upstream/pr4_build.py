"""What model build makes of an explicit fp8 index cache on ROCm's Triton
indexer, target and MTP drafter, with upstream PR 4 or without it.

``python -m tests.upstream.pr4_build --platform P --out F`` simulates GPU
``P`` with AITER off (the public MI355X recipe's setting), builds the tiny
MiniMax-M3 with ``--kv-cache-dtype fp8``, ``indexer_kv_dtype fp8`` and an MTP
drafter on the meta device with whatever vLLM ``PYTHONPATH`` gives it (PR 4's
overlay or stock; the plugin excluded), and writes the indexer impls built
and the index caches' dtypes, or the model-build error.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

MTP = {"method": "mtp", "num_speculative_tokens": 1}


def build(platform: str) -> dict[str, Any]:
    from vllm_minimax_m3_kv_sim import engine as sim
    from vllm_minimax_m3_kv_sim.hardware import simulate

    simulate(platform)
    engine = {
        "model": sim.TINY_MODEL,
        "max_model_len": 8192,
        "kv_cache_dtype": "fp8",
        "attention_config": {"indexer_kv_dtype": "fp8"},
        "speculative_config": MTP,
    }
    try:
        vllm_config = sim.make_engine_args(engine).create_engine_config()
        built = sim.build_model(vllm_config)
    except Exception as error:  # vLLM's own refusal is the result
        return {"error": sim.describe_error(error)}
    return {
        key: built.selected[key]
        for key in ("indexer_impls", "draft_indexer_impls", "index_cache_dtypes")
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--platform", required=True)
    parser.add_argument("--out", required=True)
    options = parser.parse_args()
    Path(options.out).write_text(json.dumps(build(options.platform)))


if __name__ == "__main__":
    sys.exit(main())
