"""Where upstream PR 1's default applies, per GPU, measured.

``python -m tests.upstream.pr1_scope --platform P --out F`` simulates GPU
``P`` (on ROCm with the AITER sparse PA variables the MI355 recipe sets,
unless ``--no-aiter``), builds the engine config vLLM would build for the tiny
MiniMax-M3 with ``--kv-cache-dtype fp8`` and the index cache unset, with
whatever vLLM ``PYTHONPATH`` gives it (PR 1's overlay, plugin excluded), and
writes the index-cache dtype the config resolved.
``tests/upstream/test_patch_equivalence.py`` checks it against PR 1's text.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

AITER_SPARSE_PA = {"VLLM_ROCM_USE_AITER": "1", "VLLM_ROCM_SHUFFLE_KV_CACHE_LAYOUT": "1"}


def resolved_index_cache(platform: str, aiter_sparse_pa: bool) -> str:
    from vllm_minimax_m3_kv_sim import engine as sim
    from vllm_minimax_m3_kv_sim.hardware import PLATFORMS, simulate

    if PLATFORMS[platform][0] == "rocm" and aiter_sparse_pa:
        os.environ.update(AITER_SPARSE_PA)
    simulate(platform)
    engine = {"model": sim.TINY_MODEL, "max_model_len": 8192, "kv_cache_dtype": "fp8"}
    config = sim.make_engine_args(engine).create_engine_config()
    return config.attention_config.indexer_kv_dtype


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--platform", required=True)
    parser.add_argument("--no-aiter", action="store_true")
    parser.add_argument("--out", required=True)
    options = parser.parse_args()
    dtype = resolved_index_cache(options.platform, not options.no_aiter)
    Path(options.out).write_text(json.dumps(dtype))


if __name__ == "__main__":
    sys.exit(main())
