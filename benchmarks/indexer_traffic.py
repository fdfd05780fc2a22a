"""Bytes MiniMax-M3's indexer reads per decode step, bf16 vs fp8 index cache.

A derived figure, not a GPU measurement: at each decode step the indexer
scores every cached index key of the sequence's context to choose the top-k
blocks, so it reads the whole index cache once per sparse layer. Bytes per
token come from the real index-cache specs of the full 60-layer model (built
on the meta device under a simulated MI355X, TP 8): bf16 is stock vLLM's
default, fp8 what this plugin resolves from ``--kv-cache-dtype fp8``, with
AITER sparse PA (the AITER MSA indexer) and without it, as the public MI355X
recipe runs (vLLM's Triton indexer, opened to fp8 by the plugin). The kernels
read the same index-cache bytes either way; which one reads them faster is a
GPU measurement this does not make.

``python -m benchmarks.indexer_traffic [--json]``
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from benchmarks._common import run_child, table
from vllm_minimax_m3_kv_sim.environments import AITER_SPARSE_PA

PER_TOKENS = 1024
EXAMPLE_CONTEXT = 128 * 1024
TENSOR_PARALLEL_SIZE = 8
LABELS = {
    "bf16": "bf16 (stock default)",
    "fp8": "fp8 e4m3 (plugin, AITER sparse PA)",
    "fp8_triton": "fp8 e4m3 (plugin, AITER unset)",
}
CASES = {
    "bf16": {"kv_cache_dtype": "auto"},
    "fp8": {"kv_cache_dtype": "fp8"},
    "fp8_triton": {"kv_cache_dtype": "fp8"},
}
ENVIRONMENTS = {
    "bf16": AITER_SPARSE_PA,
    "fp8": AITER_SPARSE_PA,
    "fp8_triton": {
        "VLLM_ROCM_USE_AITER": "0",
        "VLLM_ROCM_SHUFFLE_KV_CACHE_LAYOUT": "0",
    },
}


def measure(cases: list[str]) -> dict[str, Any]:
    """In a child process: the index-cache spec per case."""
    from vllm_minimax_m3_kv_sim import engine as sim
    from vllm_minimax_m3_kv_sim.hardware import simulate

    simulate("mi355x")
    found = {}
    for case in cases:
        flags = CASES[case]
        vllm_config = sim.make_engine_args(
            {
                **flags,
                "model": sim.BUNDLED_MODEL,
                "language_model_only": True,
                "tensor_parallel_size": TENSOR_PARALLEL_SIZE,
            }
        ).create_engine_config()
        built = sim.build_model(vllm_config)
        index_specs = [s for n, s in built.specs.items() if n.endswith("index_cache")]
        bytes_per_token = {
            spec.page_size_bytes // spec.block_size for spec in index_specs
        }
        assert len(bytes_per_token) == 1, bytes_per_token
        found[case] = {
            "indexer_kv_dtype": vllm_config.attention_config.indexer_kv_dtype,
            "indexer_impl": ", ".join(built.selected.get("indexer_impls", [])),
            "spec_dtype": str(index_specs[0].dtype),
            "sparse_layers": len(index_specs),
            "bytes_per_token_per_layer": bytes_per_token.pop(),
        }
    return found


def run() -> dict[str, Any]:
    found: dict[str, Any] = {}
    for env in ({**AITER_SPARSE_PA}, ENVIRONMENTS["fp8_triton"]):
        cases = [case for case in CASES if ENVIRONMENTS[case] == env]
        found.update(run_child(__spec__.name, ["--cases", ",".join(cases)], env))
    rows = {}
    for case in CASES:
        spec = found[case]
        per_layer = spec["bytes_per_token_per_layer"] * PER_TOKENS
        rows[case] = {
            **spec,
            "bytes_per_1k_context_per_layer": per_layer,
            "bytes_per_1k_context_model": per_layer * spec["sparse_layers"],
            "bytes_at_128k_context_model": spec["bytes_per_token_per_layer"]
            * EXAMPLE_CONTEXT
            * spec["sparse_layers"],
        }
    ratio = (
        rows["bf16"]["bytes_per_1k_context_model"]
        / rows["fp8"]["bytes_per_1k_context_model"]
    )
    triton = (
        rows["bf16"]["bytes_per_1k_context_model"]
        / rows["fp8_triton"]["bytes_per_1k_context_model"]
    )
    return {
        "per_decode_step_per_sequence": rows,
        "bf16_over_fp8": round(ratio, 3),
        "bf16_over_fp8_triton": round(triton, 3),
    }


def render(report: dict[str, Any]) -> str:
    rows = report["per_decode_step_per_sequence"]
    headers = [
        "index cache",
        "indexer",
        "B/token/layer",
        "per 1K context, one layer",
        f"per 1K context, model ({rows['fp8']['sparse_layers']} sparse layers)",
        "at 128K context, model",
    ]
    body = [
        [
            LABELS[case],
            row["indexer_impl"],
            row["bytes_per_token_per_layer"],
            f"{row['bytes_per_1k_context_per_layer'] / 1024:,.0f} KiB",
            f"{row['bytes_per_1k_context_model'] / (1 << 20):,.2f} MiB",
            f"{row['bytes_at_128k_context_model'] / (1 << 20):,.0f} MiB",
        ]
        for case, row in rows.items()
    ]
    return "\n\n".join(
        [
            "Indexer reads per decode step per sequence (derived from the real "
            "index-cache specs, one rank, no indexer CP)",
            table(headers, body),
            f"bf16 / fp8: {report['bf16_over_fp8']:.2f}x with AITER sparse PA, "
            f"{report['bf16_over_fp8_triton']:.2f}x with AITER unset",
        ]
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print JSON instead")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    parser.add_argument("--cases", help=argparse.SUPPRESS)
    options = parser.parse_args()
    if options.child:
        Path(options.out).write_text(json.dumps(measure(options.cases.split(","))))
        return
    report = run()
    print(json.dumps(report, indent=1) if options.json else render(report))


if __name__ == "__main__":
    sys.exit(main())
