"""Needle retention: what an fp8 index cache does to the long-context eval's
question, through vLLM's own indexer scorers on each path the plugin runs.

``python -m benchmarks.needle_retention [--quick] [--json]``

The long-context retrieval eval (``scripts/lib/minimaxm3_longctx.py``) asks
for one fact among filler at 4K to 128K tokens; the index cache decides
whether the block holding it is read. Here, in the same terms and at the same
lengths: a haystack of RMS-normed random index keys, the queries leaning
towards one direction and one key of one block (the needle) along it, at five
depths from the first block to the last. The keys and queries are stored as
the model stores them (fp8 e4m3 in the platform's flavour for both, since the
model allocates its index query in the index cache's dtype; or bf16), and
the scorers vLLM's indexer module imports on that platform choose the top-16
blocks: prefill (the last 4 tokens) and decode (one request, query lengths 1
and 2). Reported per path, length and needle strength, over every depth and
query:

- needle retention: the share whose top-k holds the needle block, fp8 and bf16;
- block recall: |fp8 top-k & bf16 top-k| / |bf16 top-k| (min, mean).

Paths: CUDA's Triton indexer (a simulated H200), ROCm's Triton indexer on
gfx950 (MI355X, e4m3fn) and gfx942 (MI300X, e4m3fnuz), AITER off. Needle
strengths: ``clear`` (the needle key three times the direction, as the node
self-test plants it: far above every other block) and ``faint`` (0.3 times:
about the 16th-best block's score, where the choice is close). Synthetic keys, not a checkpoint's:
a prediction to read beside the eval's result on the GPU, not accuracy. CPU:
Triton's interpreter, 4K and 16K (``--quick``: 4K); a CUDA GPU adds 32K,
64K and 128K. The last line of output is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from benchmarks._common import run_child, sweep_main, sweep_parser, table

PATHS = {
    "CUDA Triton (H200)": "h200",
    "ROCm Triton gfx950 (MI355X)": "mi355x",
    "ROCm Triton gfx942 (MI300X)": "mi300x",
}
LENGTHS = {"quick": (4_096,), "full": (4_096, 16_384)}
GPU_LENGTHS = (32_768, 65_536, 131_072)
STRENGTHS = {"clear": 3.0, "faint": 0.3}
DEPTHS = 5
NEEDLE_TOKEN = 37


def _cell(length: int, strength: float, device: str) -> dict[str, Any]:
    import torch

    from vllm_minimax_m3_kv import selftest

    fmt = selftest.platform_fp8()
    blocks = length // selftest.SPARSE_BLOCK
    kept = {"fp8": 0, "bf16": 0}
    rows, recalls = 0, []
    for depth in range(DEPTHS):
        needle = round(depth * (blocks - 1) / (DEPTHS - 1))
        case = selftest.Case(
            blocks=blocks,
            planted=(needle,),
            decode_requests=1,
            short_tail=0,
            seed=depth,
        )
        inputs = selftest.make_inputs(case)
        # make_inputs plants the direction at three times its size; rescale.
        at = needle * selftest.SPARSE_BLOCK + NEEDLE_TOKEN
        inputs["keys"][at] *= strength / 3.0
        stored = {
            "fp8": [selftest.e4m3(value, fmt) for value in inputs.values()],
            "bf16": [value.to(torch.bfloat16) for value in inputs.values()],
        }
        with torch.device("cpu"):
            outputs = {
                name: selftest.run_scorers(case, *values, device=device)
                for name, values in stored.items()
            }
        for output in ("prefill_topk", "decode_topk_q1", "decode_topk_q2"):
            fp8_rows = outputs["fp8"][output].reshape(-1, case.topk)
            bf16_rows = outputs["bf16"][output].reshape(-1, case.topk)
            for ours, theirs in zip(fp8_rows, bf16_rows, strict=True):
                picked = {int(b) for b in ours.tolist() if b >= 0}
                truth = {int(b) for b in theirs.tolist() if b >= 0}
                kept["fp8"] += needle in picked
                kept["bf16"] += needle in truth
                recalls.append(len(picked & truth) / len(truth))
                rows += 1
    return {
        "length": length,
        "fp8": fmt.dtype,
        "rows": rows,
        "retention_fp8": kept["fp8"] / rows,
        "retention_bf16": kept["bf16"] / rows,
        "recall_min": min(recalls),
        "recall_mean": sum(recalls) / len(recalls),
    }


def child(hardware: str, lengths: list[int]) -> dict[str, Any]:
    from vllm_minimax_m3_kv_sim.kernels import prepare_triton

    device = prepare_triton(hardware)
    start = time.perf_counter()
    cells = [
        {**_cell(length, strength, device), "needle": name}
        for length in lengths
        for name, strength in STRENGTHS.items()
    ]
    return {"device": device, "cells": cells, "seconds": time.perf_counter() - start}


def measure(size: str, workers: int) -> dict[str, Any]:
    from vllm_minimax_m3_kv_sim.kernels import has_cuda_gpu, kernel_env

    lengths = LENGTHS[size] + (GPU_LENGTHS if has_cuda_gpu() else ())
    jobs = [(path, hardware) for path, hardware in PATHS.items()]

    def run(job: tuple[str, str]) -> tuple[str, dict[str, Any]]:
        path, hardware = job
        args = ["--hardware", hardware, "--lengths", json.dumps(list(lengths))]
        return path, run_child(__spec__.name, args, kernel_env())

    with ThreadPoolExecutor(workers) as pool:
        parts = dict(pool.map(run, jobs))
    rows = [{"path": path, **cell} for path in PATHS for cell in parts[path]["cells"]]
    return {
        "device": next(iter(parts.values()))["device"],
        "size": size,
        "retention_fp8_min": min(row["retention_fp8"] for row in rows),
        "retention_bf16_min": min(row["retention_bf16"] for row in rows),
        "recall_min": min(row["recall_min"] for row in rows),
        "rows": rows,
    }


def render(result: dict[str, Any]) -> str:
    device = result["device"]
    header = (
        "Needle retention, fp8 e4m3 index cache vs bf16, vLLM's indexer scorers on "
        f"{device}" + (" (Triton interpreter)" if device == "cpu" else "")
    )
    rows = [
        [
            row["path"],
            row["fp8"].removeprefix("float8_"),
            f"{row['length']:,}",
            row["needle"],
            str(row["rows"]),
            f"{row['retention_fp8']:.3f}",
            f"{row['retention_bf16']:.3f}",
            f"{row['recall_min']:.3f}",
            f"{row['recall_mean']:.3f}",
        ]
        for row in result["rows"]
    ]
    headers = [
        "path",
        "fp8",
        "context",
        "needle",
        "rows",
        "needle kept, fp8",
        "needle kept, bf16",
        "block recall (min)",
        "block recall (mean)",
    ]
    return "\n".join([header, "", table(headers, rows)])


def main() -> None:
    parser = sweep_parser(__doc__.splitlines()[0], "4K only on a CPU")
    parser.add_argument("--hardware", help=argparse.SUPPRESS)
    parser.add_argument("--lengths", help=argparse.SUPPRESS)
    options = parser.parse_args()
    sweep_main(
        options,
        lambda: child(options.hardware, json.loads(options.lengths)),
        measure,
        render,
    )


if __name__ == "__main__":
    main()
