"""Indexer fidelity: an fp8 e4m3 index cache against a bf16 one, through
vLLM's own MiniMax-M3 kernels.

``python -m benchmarks.indexer_fidelity [--quick] [--json]``

For each context length and key distribution, the same index keys are stored
once as fp8 e4m3 in the index cache of a pool planned, allocated and bound by
vLLM with this plugin loaded (its ``uint8``/``FP8_PER_TENSOR`` description,
viewed back as e4m3), and once as bf16 in a native tensor; the index queries
are stored in the cache's dtype, as the model allocates them. vLLM's prefill
index-score and top-k kernels select blocks for the last queries of the
sequence from each; vLLM's sparse attention then attends over each selection
on the same fp8 main cache. Reported per cell, over the queries:

- top-k recall: |fp8-selected & bf16-selected| / |bf16-selected| (min, and
  the mean with a 95% interval from resampling the cell's sequences);
- score regret: (bf16 score mass of the bf16 selection - that of the fp8
  selection) / bf16 absolute score mass of the bf16 selection (max), where a
  block's score is the bf16 cache's index score (the max over its tokens);
- attention difference: ||out_fp8 - out_bf16|| / ||out_bf16|| (max);
- and whether the plugin's bound cache gives bit-identical scores to a native
  e4m3 tensor holding the same bytes.

Key distributions: ``rms`` (Gaussian keys, RMS-normed as the model's key norm
normalises its keys; random directions, not a checkpoint's keys), ``outliers`` (a few channels scaled 16x before the cast), and
``near_tied`` (every block holds a copy of one key direction plus small
noise, so block maxima nearly tie). Synthetic activations: this measures what
fp8 storage does to the indexer's choice, not model accuracy (see docs).
CPU: Triton's interpreter; a CUDA GPU: natively, with longer contexts. The
last line of output is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import random
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from benchmarks._common import run_child, sweep_main, sweep_parser, table

DISTRIBUTIONS = ("rms", "outliers", "near_tied")
CONTEXTS = {"quick": (2048, 8192, 32768), "full": (2048, 4096, 8192, 16384, 32768)}
GPU_CONTEXTS = (65536, 131072)
QUERIES = {"quick": 4, "full": 16}
SEQUENCES = {"quick": 3, "full": 8}
"""Independent sequences (keys, queries, block tables) per cell: the queries
of one sequence share its keys, so the interval resamples sequences."""
OUTLIER_CHANNELS, OUTLIER_SCALE = 4, 16.0
TIE_NOISE = 0.02
BOOTSTRAP_REPS = 2000


def _keys(distribution: str, tokens: int, dim: int, generator: Any) -> Any:
    import torch

    x = torch.randn(tokens, dim, generator=generator)
    if distribution == "near_tied":
        direction = torch.randn(dim, generator=generator)
        x = direction + TIE_NOISE * x
    x = x / x.pow(2).mean(-1, keepdim=True).sqrt()
    if distribution == "outliers":
        x[:, :OUTLIER_CHANNELS] *= OUTLIER_SCALE
    return x


def _cell(pool: Any, context: int, distribution: str, queries: int, seed: int) -> dict:
    import torch
    from vllm.models.minimax_m3.common.ops.index_topk import (
        minimax_m3_index_score,
        minimax_m3_index_topk,
    )
    from vllm.models.minimax_m3.common.ops.sparse_attn import minimax_m3_sparse_attn

    from vllm_minimax_m3_kv_sim.kernels import write_bytes

    device = pool.device
    generator = torch.Generator().manual_seed(seed)
    blocks = context // 128
    table_ids = torch.randperm(pool.kv_cache_config.num_blocks - 1, generator=generator)
    table_ids = (table_ids[:blocks] + 1).to(torch.int32)
    block_table = table_ids.view(1, -1).to(device)
    index = pool.index_cache
    dim = index.shape[-1]
    keys = _keys(distribution, context, dim, generator).view(blocks, 128, dim)
    ids = table_ids.long().to(device)
    write_bytes(index, ids, keys.to(torch.float8_e4m3fn).to(device))
    bf16 = torch.zeros(index.shape, dtype=torch.bfloat16, device=device)
    write_bytes(bf16, ids, keys.to(torch.bfloat16).to(device))
    native = torch.zeros(index.shape, dtype=torch.float8_e4m3fn, device=device)
    write_bytes(native, ids, keys.to(torch.float8_e4m3fn).to(device))
    impl = pool.main_layer.impl
    main = pool.main_cache
    kv = torch.randn(blocks, *main.shape[1:], generator=generator)
    write_bytes(main, ids, kv.to(main.dtype).to(device))
    heads = pool.main_layer.kv_cache.shape[1]
    sparse = pool.sparse_config()
    topk = int(sparse["sparse_topk_blocks"])
    init, local = (
        int(sparse.get("sparse_init_block", 0)),
        int(sparse.get("sparse_local_block", 1)),
    )
    index_q = _keys("rms", queries, dim, generator).view(queries, 1, dim)
    index_q = index_q.expand(queries, heads, dim).to(device)
    # The model allocates its index query in the index cache's dtype
    # (models/minimax_m3/{nvidia,amd}/model.py): fp8 beside fp8, bf16 beside bf16.
    query_for = {
        torch.float8_e4m3fn: index_q.to(torch.float8_e4m3fn),
        torch.bfloat16: index_q.to(torch.bfloat16),
    }
    q = torch.randn(queries, impl.num_heads, impl.head_size, generator=generator)
    q = q.to(torch.bfloat16).to(device)
    cu = torch.tensor([0, queries], dtype=torch.int32, device=device)
    seq = torch.tensor([context], dtype=torch.int32, device=device)
    prefix = torch.tensor([context - queries], dtype=torch.int32, device=device)

    def select(cache: Any) -> tuple[Any, Any]:
        score = minimax_m3_index_score(
            query_for[cache.dtype], cache, block_table, cu, seq, prefix, queries,
            context, heads,
        )  # fmt: skip
        chosen = minimax_m3_index_topk(score, cu, prefix, queries, topk, init, local)
        return score, chosen

    def attend(chosen: Any) -> Any:
        out = torch.empty_like(q)
        minimax_m3_sparse_attn(
            q, main, chosen, block_table, cu, seq, prefix, queries,
            impl.num_kv_heads, impl.scale, out,
        )  # fmt: skip
        return out.float()

    fp8_score, fp8_topk = select(index)
    # The plugin's bound cache against a native e4m3 tensor with the same bytes.
    native_score = minimax_m3_index_score(
        query_for[native.dtype], native, block_table, cu, seq, prefix, queries,
        context, heads,
    )  # fmt: skip
    bf16_score, bf16_topk = select(bf16)
    recalls, regrets = [], []
    for query in range(queries):
        ours = {int(b) for b in fp8_topk[0, query].tolist() if b >= 0}
        truth = {int(b) for b in bf16_topk[0, query].tolist() if b >= 0}
        recalls.append(len(ours & truth) / len(truth))
        scores = bf16_score[0, query, :blocks].float()
        mass = scores[sorted(truth)].sum()
        scale = scores[sorted(truth)].abs().sum()
        regrets.append(float((mass - scores[sorted(ours)].sum()) / scale))
    out_fp8, out_bf16 = attend(fp8_topk), attend(bf16_topk)
    diff = ((out_fp8 - out_bf16).norm(dim=(1, 2)) / out_bf16.norm(dim=(1, 2))).max()
    return {
        "context": context,
        "distribution": distribution,
        "queries": queries,
        "recall_min": min(recalls),
        "recall_mean": sum(recalls) / len(recalls),
        "regret_max": max(regrets),
        "attention_rel_diff_max": float(diff),
        "plugin_layout_identical": bool(torch.equal(fp8_score, native_score)),
    }


def child(cells: list[list], queries: int) -> dict:
    from vllm_minimax_m3_kv_sim.kernels import bound_pool, prepare_triton

    device = prepare_triton()
    longest = max(cell[0] for cell in cells)
    # The tiny MiniMax-M3 at TP 8 takes 196,608 bytes per block; room for the
    # longest sequence, plus the null block.
    pool = bound_pool(
        {"kv_cache_dtype": "fp8", "max_model_len": longest, "tensor_parallel_size": 8},
        device,
        kv_bytes=(longest // 128 + 2) * 196608 * 2,
    )
    start = time.perf_counter()
    rows = [
        _cell(pool, context, distribution, queries, seed)
        for context, distribution, seed in cells
    ]
    return {
        "device": device,
        "index_spec": list(pool.spec_of(pool.sparse_layer)),
        "rows": rows,
        "seconds": time.perf_counter() - start,
    }


def _pooled(runs: list[dict]) -> dict:
    """One cell over its sequences: the extremes over every query, the mean
    recall with a percentile bootstrap interval over sequences."""
    means = [run["recall_mean"] for run in runs]
    draw = random.Random(0)
    resampled = sorted(
        sum(draw.choices(means, k=len(means))) / len(means)
        for _ in range(BOOTSTRAP_REPS)
    )
    return {
        "context": runs[0]["context"],
        "distribution": runs[0]["distribution"],
        "sequences": len(runs),
        "queries": runs[0]["queries"],
        "recall_min": min(run["recall_min"] for run in runs),
        "recall_mean": sum(means) / len(means),
        "recall_interval": [
            resampled[int(0.025 * BOOTSTRAP_REPS)],
            resampled[int(0.975 * BOOTSTRAP_REPS) - 1],
        ],
        "regret_max": max(run["regret_max"] for run in runs),
        "attention_rel_diff_max": max(run["attention_rel_diff_max"] for run in runs),
        "plugin_layout_identical": all(run["plugin_layout_identical"] for run in runs),
    }


def measure(size: str, workers: int) -> dict:
    from vllm_minimax_m3_kv_sim.kernels import has_cuda_gpu, kernel_env

    contexts = CONTEXTS[size] + (GPU_CONTEXTS if has_cuda_gpu() else ())
    cells = [
        [c, d, seed]
        for c in contexts
        for d in DISTRIBUTIONS
        for seed in range(SEQUENCES[size])
    ]
    # Longest first, dealt round-robin: the two children finish together.
    cells.sort(key=lambda cell: -cell[0])
    shares = [cells[i::workers] for i in range(workers)]
    args = [
        ["--cells", json.dumps(share), "--queries", str(QUERIES[size])]
        for share in shares
    ]
    with ThreadPoolExecutor(workers) as pool:
        parts = list(
            pool.map(lambda a: run_child(__spec__.name, a, kernel_env()), args)
        )
    sequences: dict[tuple[int, str], list[dict]] = {}
    for part in parts:
        for row in part["rows"]:
            sequences.setdefault((row["context"], row["distribution"]), []).append(row)
    rows = [
        _pooled(runs)
        for _, runs in sorted(
            sequences.items(),
            key=lambda item: (item[0][0], DISTRIBUTIONS.index(item[0][1])),
        )
    ]
    return {
        "plugin_layout_identical": all(r["plugin_layout_identical"] for r in rows),
        "topk_recall": min(row["recall_min"] for row in rows),
        "score_regret_max": max(row["regret_max"] for row in rows),
        "attention_rel_diff_max": max(row["attention_rel_diff_max"] for row in rows),
        "device": parts[0]["device"],
        "index_spec": parts[0]["index_spec"],
        "size": size,
        "rows": rows,
    }


def render(result: dict) -> str:
    header = (
        f"Index cache fp8 e4m3 (the plugin's pool, {'/'.join(result['index_spec'])}) "
        f"vs bf16, vLLM's MiniMax-M3 kernels on {result['device']}"
        + (" (Triton interpreter)" if result["device"] == "cpu" else "")
    )
    rows = [
        [
            f"{row['context']:,}",
            row["distribution"],
            f"{row['sequences']} x {row['queries']}",
            f"{row['recall_min']:.3f}",
            f"{row['recall_mean']:.3f} [{row['recall_interval'][0]:.3f}, "
            f"{row['recall_interval'][1]:.3f}]",
            f"{row['regret_max']:.4f}",
            f"{row['attention_rel_diff_max']:.4f}",
        ]
        for row in result["rows"]
    ]
    return "\n".join(
        [
            header,
            "",
            table(
                [
                    "context",
                    "keys",
                    "sequences x queries",
                    "top-k recall (min)",
                    "recall (mean) [95%]",
                    "score regret (max)",
                    "attention rel. diff (max)",
                ],
                rows,
            ),
            "",
            f"plugin layout bit-identical to a native e4m3 cache: "
            f"{result['plugin_layout_identical']}",
        ]
    )


def main() -> None:
    parser = sweep_parser(__doc__.splitlines()[0], "fewer contexts and queries")
    parser.add_argument("--cells", help=argparse.SUPPRESS)
    parser.add_argument("--queries", type=int, help=argparse.SUPPRESS)
    options = parser.parse_args()
    sweep_main(
        options,
        lambda: child(json.loads(options.cells), options.queries),
        measure,
        render,
    )


if __name__ == "__main__":
    main()
