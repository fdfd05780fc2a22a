"""vLLM's MiniMax-M3 decode index scorer on this GPU: fp8 vs bf16 index cache.

Times ``minimax_m3_index_decode`` as vLLM's indexer module imports it on this
platform (on ROCm ``models/minimax_m3/amd/ops/index_topk.py``), on a bf16 and
an fp8 e4m3 index cache holding the same values, per batch and context length.
vLLM's ROCm launch policy gives its tuned "balanced" score kernel to bf16 only
(``_decode_score_program_budget``) and split-K to fp8, so on ROCm bf16 is also
timed with the balanced kernel turned off, and fp8 with it offered to fp8 too:
the ratios then tell the dtype and the kernel choice apart, and say whether
extending vLLM's policy to fp8 would pay. Ratios come from one run on one GPU; without a GPU it
says so and times nothing.

``python -m benchmarks.decode_scorer [--json] [--iters N]``
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
from collections.abc import Iterator
from typing import Any

from benchmarks._common import table

BATCHES = (1, 8, 32)
CONTEXTS = (8 * 1024, 64 * 1024)
BLOCK = 128
INDEX_DIM = 128
TOPK = 16
NO_GPU = (
    "no GPU in this process: nothing timed (run it on the serving node, where "
    "vLLM and its kernels are installed)"
)


def _cache(batch: int, context: int, dtype: Any, device: str) -> tuple[Any, Any]:
    import torch

    from vllm_minimax_m3_kv.selftest import e4m3

    blocks = context // BLOCK
    generator = torch.Generator().manual_seed(0)
    keys = torch.randn(batch * blocks, BLOCK, INDEX_DIM, generator=generator)
    stored = e4m3(keys)
    cache = (stored if dtype == torch.float8_e4m3fn else stored.to(dtype)).to(device)
    table_ = torch.arange(batch * blocks, dtype=torch.int32).view(batch, blocks)
    return cache, table_.to(device)


@contextlib.contextmanager
def _balanced_off(ops: Any) -> Iterator[None]:
    """vLLM's ROCm policy with the balanced kernel declined (split-K for all)."""
    budget = getattr(ops, "_decode_score_program_budget", None)
    if budget is None:
        yield
        return
    ops._decode_score_program_budget = lambda *args, **kwargs: None
    try:
        yield
    finally:
        ops._decode_score_program_budget = budget


@contextlib.contextmanager
def _balanced_for_fp8(ops: Any) -> Iterator[None]:
    """vLLM's ROCm policy offering the balanced kernel to an fp8 cache and
    query too: the plugin's VLLM_MINIMAX_M3_KV_FP8_BALANCED_DECODE=1."""
    from vllm_minimax_m3_kv.model_executor.models.minimax_m3_rocm_fp8_triton_indexer import (
        wrap_decode_score_program_budget,
    )

    budget = ops._decode_score_program_budget
    ops._decode_score_program_budget = wrap_decode_score_program_budget(
        budget, enabled=True
    )
    try:
        yield
    finally:
        ops._decode_score_program_budget = budget


def _time(run: Any, iters: int) -> float:
    import torch

    for _ in range(5):
        run()
    samples = []
    for _ in range(iters):
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        run()
        end.record()
        torch.cuda.synchronize()
        samples.append(start.elapsed_time(end) * 1000.0)
    return statistics.median(samples)


def measure(iters: int) -> dict[str, Any]:
    import torch
    from vllm.models.minimax_m3.common import indexer as vllm_indexer

    decode = vllm_indexer.minimax_m3_index_decode
    ops = sys.modules[decode.__module__]
    rows = []
    for batch in BATCHES:
        for context in CONTEXTS:
            timed: dict[str, float] = {}
            query = torch.randn(batch, 1, INDEX_DIM, device="cuda")
            lens = torch.full((batch,), context, dtype=torch.int32, device="cuda")
            for name, dtype in (("bf16", torch.bfloat16), ("fp8", torch.float8_e4m3fn)):
                cache, block_table = _cache(batch, context, dtype, "cuda")
                q = query.to(torch.float8_e4m3fn if dtype != torch.bfloat16 else dtype)

                def run(
                    q: Any = q,
                    cache: Any = cache,
                    block_table: Any = block_table,
                    lens: Any = lens,
                    context: int = context,
                ) -> None:
                    decode(q, cache, block_table, lens, context, TOPK, 0, 1, 1, 1, 1)

                timed[name] = _time(run, iters)
                if not hasattr(ops, "_decode_score_program_budget"):
                    continue
                if name == "bf16":
                    with _balanced_off(ops):
                        timed["bf16_split_k"] = _time(run, iters)
                else:
                    with _balanced_for_fp8(ops):
                        timed["fp8_balanced"] = _time(run, iters)
            rows.append({"batch": batch, "context": context, "us": timed})
    return {"gpu": torch.cuda.get_device_name(), "iters": iters, "rows": rows}


def render(report: dict[str, Any]) -> str:
    split = any("bf16_split_k" in row["us"] for row in report["rows"])
    headers = ["batch", "context", "bf16 us", "fp8 us", "fp8 / bf16"]
    if split:
        headers += ["bf16 split-K us", "fp8 / bf16 split-K", "fp8 balanced us"]
    body = []
    for row in report["rows"]:
        us = row["us"]
        line = [
            row["batch"],
            f"{row['context']:,}",
            f"{us['bf16']:.1f}",
            f"{us['fp8']:.1f}",
            f"{us['fp8'] / us['bf16']:.2f}x",
        ]
        if split:
            line += [
                f"{us['bf16_split_k']:.1f}",
                f"{us['fp8'] / us['bf16_split_k']:.2f}x",
            ]
        body.append(line)
    return "\n\n".join(
        [
            f"vLLM's decode index scorer on {report['gpu']}, median of "
            f"{report['iters']} launches, one index head",
            table(headers, body),
        ]
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print JSON instead")
    parser.add_argument("--iters", type=int, default=50, help="timed launches per row")
    options = parser.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print(json.dumps({"gpu": None, "note": NO_GPU}) if options.json else NO_GPU)
        return 0
    report = measure(options.iters)
    print(json.dumps(report, indent=1) if options.json else render(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
