"""KV capacity of the full MiniMax-M3 on MI355X: stock vLLM 0.33 vs this plugin.

For each tensor-parallel size, vLLM's own planner sizes the KV block pool for
one rank from the layer specs the real 60-layer model returns (built on the
meta device under a simulated MI355X), for a fixed KV memory budget:

  (a) stock 0.33, public MI355X recipe: ``--kv-cache-dtype fp8``, AITER off,
      indexer left at its bf16 default;
  (b) stock 0.33, B300-style flags: ``--attention-config.indexer_kv_dtype fp8``
      with AITER sparse paged attention on (the only ROCm fp8 indexer);
  (c) this plugin, MI355X launch script: ``--kv-cache-dtype fp8``, AITER on,
      the indexer inherits fp8.

``python -m benchmarks.kv_capacity [--kv-memory-gib 64] [--json]``
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from benchmarks._common import run_child, table
from vllm_minimax_m3_kv_sim.environments import AITER_SPARSE_PA, STOCK_VLLM

TENSOR_PARALLEL_SIZES = (1, 2, 4, 8)
# The planner needs room for one request of this length; capacity in tokens
# does not depend on it.
MAX_MODEL_LEN = 131072
CASES: dict[str, dict[str, Any]] = {
    "a": {
        "label": "stock, public MI355X recipe",
        "env": STOCK_VLLM,
        "engine": {"kv_cache_dtype": "fp8"},
    },
    "b": {
        "label": "stock, explicit fp8 indexer",
        "env": {**STOCK_VLLM, **AITER_SPARSE_PA},
        "engine": {
            "kv_cache_dtype": "fp8",
            "attention_config": {"indexer_kv_dtype": "fp8"},
        },
    },
    "c": {
        "label": "plugin, MI355X launch script",
        "env": AITER_SPARSE_PA,
        "engine": {"kv_cache_dtype": "fp8"},
    },
}


def measure(case: str, kv_memory_bytes: int) -> list[dict[str, Any]]:
    """In a child process: one case, every TP size."""
    from vllm_minimax_m3_kv_sim import engine as sim
    from vllm_minimax_m3_kv_sim.hardware import simulate

    simulate("mi355x")
    rows = []
    for tp in TENSOR_PARALLEL_SIZES:
        flags = {
            **CASES[case]["engine"],
            "model": sim.BUNDLED_MODEL,
            "language_model_only": True,
            "max_model_len": MAX_MODEL_LEN,
        }
        args = sim.make_engine_args({**flags, "tensor_parallel_size": tp})
        vllm_config = args.create_engine_config()
        built = sim.build_model(vllm_config)
        result = sim.plan(vllm_config, [built.specs], kv_memory_bytes)
        per_token = {"main": 0, "indexer": 0}
        for name, spec in built.specs.items():
            side = "indexer" if name.endswith("index_cache") else "main"
            per_token[side] += spec.page_size_bytes // spec.block_size
        rows.append(
            {
                "tp": tp,
                "indexer_kv_dtype": vllm_config.attention_config.indexer_kv_dtype,
                "indexer_impls": built.selected["indexer_impls"],
                "sparse_layers": sum(n.endswith("index_cache") for n in built.specs),
                "bytes_per_token": {**per_token, "total": sum(per_token.values())},
                "num_blocks": result["num_blocks"],
                "tokens": result["tokens"],
                "worker_zeroer": result["workers"][0],
                "scheduler_zeroes": result["scheduler"],
            }
        )
    return rows


def run(kv_memory_gib: float) -> dict[str, Any]:
    budget = int(kv_memory_gib * (1 << 30))
    results = {
        case: run_child(
            __spec__.name,
            ["--case", case, "--kv-memory-bytes", str(budget)],
            spec["env"],
        )
        for case, spec in CASES.items()
    }
    ratios = {
        str(row_a["tp"]): round(row_c["tokens"] / row_a["tokens"], 3)
        for row_a, row_c in zip(results["a"], results["c"], strict=True)
    }
    return {
        "kv_memory_bytes_per_gpu": budget,
        "cases": {case: CASES[case]["label"] for case in CASES},
        "results": results,
        "token_ratio_c_over_a": ratios,
    }


def _indexer_label(value: str) -> str:
    # vLLM resolves "auto" to bf16 for MiniMax-M3.
    return "bf16 (auto)" if value == "auto" else value


def render(report: dict[str, Any]) -> str:
    headers = [
        "TP",
        "case",
        "indexer",
        "B/token main",
        "B/token indexer",
        "B/token total",
        "blocks",
        "tokens",
        "zeroer (workers / scheduler)",
    ]
    rows = []
    for tp_index, tp in enumerate(TENSOR_PARALLEL_SIZES):
        for case, label in report["cases"].items():
            row = report["results"][case][tp_index]
            size = row["bytes_per_token"]
            rows.append(
                [
                    tp,
                    f"({case}) {label}",
                    _indexer_label(row["indexer_kv_dtype"]),
                    f"{size['main']:,}",
                    f"{size['indexer']:,}",
                    f"{size['total']:,}",
                    f"{row['num_blocks']:,}",
                    f"{row['tokens']:,}",
                    f"{row['worker_zeroer']} / {row['scheduler_zeroes']}",
                ]
            )
    ratio_rows = [[tp, f"{r:.2f}x"] for tp, r in report["token_ratio_c_over_a"].items()]
    gib = report["kv_memory_bytes_per_gpu"] / (1 << 30)
    return "\n\n".join(
        [
            f"KV capacity per GPU, {gib:g} GiB KV budget, full MiniMax-M3 on simulated "
            f"MI355X, max_model_len {MAX_MODEL_LEN:,}",
            table(headers, rows),
            table(["TP", "tokens (c) / (a)"], ratio_rows),
        ]
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--kv-memory-gib",
        type=float,
        default=64.0,
        help="KV cache memory per GPU handed to vLLM's planner (ratios do not depend on it)",
    )
    parser.add_argument("--json", action="store_true", help="print JSON instead")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--case", choices=sorted(CASES), help=argparse.SUPPRESS)
    parser.add_argument("--kv-memory-bytes", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    options = parser.parse_args()
    if options.child:
        rows = measure(options.case, options.kv_memory_bytes)
        Path(options.out).write_text(json.dumps(rows))
        return
    report = run(options.kv_memory_gib)
    print(json.dumps(report, indent=1) if options.json else render(report))


if __name__ == "__main__":
    sys.exit(main())
