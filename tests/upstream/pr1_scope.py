"""Where upstream PR 1's default applies, per GPU, measured.

``python -m tests.upstream.pr1_scope --platform P [--topk-blocks N] --out F``
simulates GPU ``P`` (on ROCm with the AITER sparse PA variables the MI355
recipe sets, unless ``--no-aiter``), builds the engine config vLLM would
build for the tiny MiniMax-M3 (its ``sparse_topk_blocks`` set to N where
given) with ``--kv-cache-dtype fp8`` and the index cache unset, with
whatever vLLM ``PYTHONPATH`` gives it (PR 1's overlay, plugin excluded), and
writes the index-cache dtype the config resolved.
``tests/upstream/test_patch_equivalence.py`` checks it against PR 1's text.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

AITER_SPARSE_PA = {"VLLM_ROCM_USE_AITER": "1", "VLLM_ROCM_SHUFFLE_KV_CACHE_LAYOUT": "1"}


def _tiny_model(topk_blocks: int | None, into: Path) -> str:
    from vllm_minimax_m3_kv_sim import engine as sim

    if topk_blocks is None:
        return sim.TINY_MODEL
    config = json.loads((Path(sim.TINY_MODEL) / "config.json").read_text())
    config["text_config"]["sparse_attention_config"]["sparse_topk_blocks"] = topk_blocks
    into.mkdir(parents=True, exist_ok=True)
    (into / "config.json").write_text(json.dumps(config))
    return str(into)


def resolved_index_cache(
    platform: str, aiter_sparse_pa: bool, topk_blocks: int | None = None
) -> str:
    from vllm_minimax_m3_kv_sim import engine as sim
    from vllm_minimax_m3_kv_sim.hardware import PLATFORMS, simulate

    if PLATFORMS[platform][0] == "rocm" and aiter_sparse_pa:
        os.environ.update(AITER_SPARSE_PA)
    simulate(platform)
    with tempfile.TemporaryDirectory() as scratch:
        model = _tiny_model(topk_blocks, Path(scratch) / "model")
        engine = {"model": model, "max_model_len": 8192, "kv_cache_dtype": "fp8"}
        config = sim.make_engine_args(engine).create_engine_config()
    return config.attention_config.indexer_kv_dtype


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--platform", required=True)
    parser.add_argument("--no-aiter", action="store_true")
    parser.add_argument("--topk-blocks", type=int, default=None)
    parser.add_argument("--out", required=True)
    options = parser.parse_args()
    dtype = resolved_index_cache(
        options.platform, not options.no_aiter, options.topk_blocks
    )
    Path(options.out).write_text(json.dumps(dtype))


if __name__ == "__main__":
    sys.exit(main())
