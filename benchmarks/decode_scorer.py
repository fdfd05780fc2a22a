"""``python -m benchmarks.decode_scorer``: the same as ``vllm-minimax-m3-kv
bench`` (``vllm_minimax_m3_kv/entrypoints/bench.py``), which the plugin's
install carries onto the node; kept for the commands the docs name."""

from __future__ import annotations

import sys

from vllm_minimax_m3_kv.entrypoints.bench import main

if __name__ == "__main__":
    sys.exit(main())
