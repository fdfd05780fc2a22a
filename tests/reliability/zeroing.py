"""Who zeroes KV blocks, per public recipe and kernel: ``python -m tests.reliability.zeroing``.

Each recipe's flags go through real vLLM 0.33 on its simulated GPU, without
this plugin (``VLLM_PLUGINS``) and with it: config, the model on the meta
device (at PP 2 also as each stage's worker builds it) and vLLM's planner.
What the planner says is read as vLLM 0.33 acts on it:

- a worker builds zeroing metadata only when its own ``KVCacheConfig`` needs
  zeroing (``Worker.initialize_from_config``, ``v1/worker/gpu_worker.py``);
- the scheduler hands workers new blocks to zero only when its own config
  needs zeroing (``Scheduler._get_new_block_ids_to_zero``,
  ``v1/core/sched/scheduler.py``), so that is when blocks are zeroed;
- the cache is allocated with ``torch.zeros`` (``allocate_kv_cache``,
  ``v1/worker/utils.py``): a block's first use reads zeros, a reused block
  what an earlier request wrote there.

Prints two markdown tables (docs/reliability.md holds them, and
``tests/test_docs.py`` checks they are this command's output).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

from vllm_minimax_m3_kv_sim.environments import AITER_SPARSE_PA, STOCK_VLLM
from vllm_minimax_m3_kv_sim.plumbing.children import json_from_out_file

# TP 4: one 8-GPU node at PP 2 (two stages of 4), as the recipes run PP.
FP8 = {"kv_cache_dtype": "fp8", "max_model_len": 8192, "tensor_parallel_size": 4}
FP8_INDEXER = {**FP8, "attention_config": {"indexer_kv_dtype": "fp8"}}

# (id, label, simulated GPU, environment, engine): the public recipes' KV flags.
RECIPES = [
    ("b300", "public B300 recipe", "b300", {}, FP8_INDEXER),
    ("mi355x", "public MI355X recipe (AITER off)", "mi355x", {}, FP8),
    (
        "mi355x_aiter_fp8_indexer",
        "MI355X, AITER sparse PA, explicit fp8 indexer",
        "mi355x",
        AITER_SPARSE_PA,
        FP8_INDEXER,
    ),
]

KERNELS = {
    # (indexer impl class, GPU family) -> (kernel, what ran here)
    ("MiniMaxM3IndexerTritonImpl", "mi"): (
        "vLLM's Triton indexer and sparse attention",
        "shown stale-safe by execution, Triton's interpreter on CPU: every slot "
        "of the bound pool filled with stale bytes leaves top-k, scores and "
        "outputs bit-identical (tests/kernels/test_stale_bytes.py, the common "
        "kernels); on ROCm's own indexer scorers, stale e4m3 bytes in the slots "
        "no token fills leave scores and top-k bit-identical "
        "(tests/kernels/test_rocm_fp8_triton_indexer.py); ROCm's sparse "
        "attention kernels not run",
    ),
    ("MiniMaxM3IndexerMSAImpl", "mi"): (
        "AITER MSA indexer and AITER sparse paged attention (HIP)",
        "none: never run here (HIP kernels built by aiter need an MI355X)",
    ),
    ("MiniMaxM3IndexerMSAImpl", "b"): (
        "fmha_sm100 MSA indexer (CUDA)",
        "none: never run here (CUDA kernels need an SM100 GPU)",
    ),
}


def _scenarios(env: dict[str, str], engine: dict[str, Any], name: str) -> dict:
    return {"id": name, "env": env, "engine": engine, "per_stage": True}


def facts() -> list[dict[str, Any]]:
    """Per recipe: the kernels it selects and who zeroes, stock and plugin."""
    rows = []
    for plugin in (False, True):
        by_gpu: dict[str, list[dict]] = {}
        for name, _, gpu, env, engine in RECIPES:
            by_gpu.setdefault(gpu, []).append(_scenarios(env, engine, name))
        results: dict[str, dict] = {}
        for gpu, scenarios in by_gpu.items():
            with tempfile.TemporaryDirectory() as tmp:
                path = Path(tmp, "scenarios.json")
                path.write_text(json.dumps(scenarios))
                argv = [
                    "-m",
                    "vllm_minimax_m3_kv_sim.programs.runner",
                    "--platform",
                    gpu,
                    "--scenarios",
                    str(path),
                ]
                for record in json_from_out_file(argv, None if plugin else STOCK_VLLM):
                    results[record["id"]] = record
        for name, label, gpu, _, _ in RECIPES:
            result = results[name]
            rows.append(
                {
                    "recipe": label,
                    "gpu": gpu,
                    "plugin": plugin,
                    "indexer_impls": result.get("indexer_impls", []),
                    "main_impls": result.get("main_impls", []),
                    "pp1": result.get("pp1"),
                    "pp2": result.get("pp2_per_stage"),
                    "error": result.get("build_error") or result.get("config_error"),
                }
            )
    return rows


def _zeroed(plan: dict[str, Any]) -> str:
    workers = ", ".join("yes" if w else "no" for w in plan["workers"])
    if plan["scheduler"]:
        return f"zeroer on workers: {workers}; scheduler asks: yes: new blocks zeroed"
    return f"zeroer on workers: {workers}; scheduler asks: no: no block is ever zeroed"


def render(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| recipe (flags as published) | plugin | indexer kernel | PP 1 | PP 2 (each stage built by its worker) |",
        "| --- | --- | --- | --- | --- |",
    ]
    for row in rows:
        kernel = ", ".join(row["indexer_impls"]) or "-"
        if row["error"]:
            who = "the plugin" if row["error"]["from_plugin"] else "vLLM"
            pp1 = pp2 = f"refused at config time by {who}"
        else:
            pp1, pp2 = _zeroed(row["pp1"]), _zeroed(row["pp2"])
        lines.append(
            f"| {row['recipe']} | {'on' if row['plugin'] else 'off'} | {kernel} | {pp1} | {pp2} |"
        )
    stock = [row for row in rows if not row["plugin"] and not row["error"]]
    lines += [
        "",
        "| kernel | selected by | runs over blocks nobody zeroes, stock vLLM 0.33 today | stale-slot evidence |",
        "| --- | --- | --- | --- |",
    ]
    for (impl, family), (kernel, evidence) in KERNELS.items():
        using = [
            row
            for row in stock
            if impl in row["indexer_impls"] and row["gpu"].startswith(family)
        ]
        unzeroed = [
            row["recipe"]
            for row in using
            if not row["pp1"]["scheduler"] and not row["pp2"]["scheduler"]
        ]
        selected = ", ".join(row["recipe"] for row in using) or "not selected here"
        runs = f"yes, at PP 1 and 2: {'; '.join(unzeroed)}" if unzeroed else "no"
        lines.append(f"| {kernel} | {selected} | {runs} | {evidence} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true")
    options = parser.parse_args()
    rows = facts()
    print(json.dumps(rows, indent=1) if options.json else render(rows))


if __name__ == "__main__":
    sys.exit(main())
