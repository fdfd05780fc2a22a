"""With the plugin left out, ``check`` says what stock vLLM 0.33 does:
compared, cell by cell, with stock's real build (config, model on the meta
device, KV planner) run by the harness on the same simulated node, over the
ROCm and CUDA cells operators meet (AITER off / on / on with the shuffled
layout, indexer auto / fp8 / bf16, TP, MI355X / MI300X / B300 / H200)."""

from __future__ import annotations

import json

import pytest

from tests.entrypoints.test_check import run_checks
from vllm_minimax_m3_kv.entrypoints.check.script import split_command
from vllm_minimax_m3_kv_sim.plumbing.children import run_python

OFF = {"VLLM_ROCM_USE_AITER": "0", "VLLM_ROCM_SHUFFLE_KV_CACHE_LAYOUT": "0"}
AITER = {"VLLM_ROCM_USE_AITER": "1", "VLLM_ROCM_SHUFFLE_KV_CACHE_LAYOUT": "0"}
SPARSE_PA = {"VLLM_ROCM_USE_AITER": "1", "VLLM_ROCM_SHUFFLE_KV_CACHE_LAYOUT": "1"}
# (env, indexer_kv_dtype or None, tensor_parallel_size) per node
# Each stock answer costs a vLLM import in check's child: 13 cells, chosen so
# every node shows the answers stock gives there.
CELLS = {
    "mi355x": [
        (OFF, None, 8),  # today's public recipe: mixed
        (OFF, "fp8", 8),  # refused: no fp8 indexer without AITER
        (AITER, "fp8", 8),
        *((SPARSE_PA, indexer, 8) for indexer in (None, "fp8", "bf16")),
        (SPARSE_PA, None, 1),  # bf16 index cache beside sparse PA, 4 heads/rank
    ],
    "mi300x": [(OFF, "fp8", 8), (SPARSE_PA, None, 8), (SPARSE_PA, "fp8", 8)],
    "b300": [({}, None, 4), ({}, "fp8", 4)],
    "h200": [({}, "fp8", 8)],
}
SEEN = {"mi355x": {2, 3}, "mi300x": {2, 3}, "b300": {3}, "h200": {3}}
"""The exit codes each node's cells give: stock refuses on ROCm, runs mixed
everywhere (an fp8 index cache is another kind than the main cache's fp8)."""


def _argv(indexer: str | None, tp: int) -> list[str]:
    argv = ["--kv-cache-dtype", "fp8", "--block-size", "128", "--language-model-only"]
    argv += ["--attention-backend", "TRITON_ATTN", "-tp", str(tp)]
    return argv + (["--attention-config.indexer_kv_dtype", indexer] if indexer else [])


def _command(env: dict, indexer: str | None, tp: int) -> str:
    words = [f"{k}={v}" for k, v in env.items()]
    words += ["VLLM_PLUGINS=", "vllm serve --kv-cache-dtype fp8 --block-size 128"]
    words += ["--language-model-only --attention-backend TRITON_ATTN", f"-tp {tp}"]
    if indexer:
        words.append(f"--attention-config.indexer_kv_dtype {indexer}")
    return " ".join(words)


def _engine(indexer: str | None, tp: int) -> dict:
    attention = {"indexer_kv_dtype": indexer} if indexer else {}
    return {
        "kv_cache_dtype": "fp8",
        "tensor_parallel_size": tp,
        "language_model_only": True,
        "attention_config": attention,
    }


@pytest.mark.parametrize("node", sorted(CELLS))
def test_plugin_off_check_is_stocks_own_build(tmp_path, node):
    cells = CELLS[node]
    script = tmp_path / "commands.sh"
    script.write_text("\n".join(_command(*cell) for cell in cells) + "\n")
    check = ["-m", "vllm_minimax_m3_kv", "check", "--target", node]
    proc = run_python([*check, "--commands", str(script), "--json"], {}, 900)
    rows = json.loads(proc.stdout)["rows"]
    stock_cells = tmp_path / "cells.json"
    stock_cells.write_text(
        json.dumps([{"env": env, "engine": _engine(i, tp)} for env, i, tp in cells])
    )
    harness = ["-m", "vllm_minimax_m3_kv_sim.programs.stock_cells", node]
    built = run_python([*harness, str(stock_cells)], {"VLLM_PLUGINS": ""}, 900)
    assert built.returncode == 0, built.stderr[-3000:]
    stock = json.loads(built.stdout.strip().splitlines()[-1])
    disagreements = []
    for cell, row, truth in zip(cells, rows, stock, strict=True):
        said = {"exit": row["exit"], "indexer": row["indexer_kv_dtype"]}
        if not truth["starts"]:
            expected = {"exit": 2, "indexer": said["indexer"]}
        else:
            exit_code = 3 if truth["mixed"] else 0
            expected = {"exit": exit_code, "indexer": truth["indexer_kv_dtype"]}
        if said != expected:
            disagreements.append((cell, said, expected, row["why"]))
    assert disagreements == [], disagreements
    # The answers differ across cells: a check that said one thing would fail.
    assert {row["exit"] for row in rows} == SEEN[node]
    # With the plugin on, the plan compares capacity only with a pool stock
    # starts, and says where stock cannot start the command as typed.
    plans = run_checks(
        [
            {"argv": ["--target", node, *_argv(indexer, tp)], "env": env}
            for env, indexer, tp in cells
        ]
    )
    # Each refusal's fix (the plugin turned on) starts when run as printed.
    fixed = [
        split_command(fix.split("  # ", 1)[0])
        for row in rows
        if row["exit"] == 2
        for fix in row["fixes"]
    ]
    # (None where the plugin refuses the command too: MI300X beside sparse PA.)
    assert bool(fixed) is (2 in SEEN[node])
    reruns = run_checks(
        [{"argv": ["--target", node, *argv], "env": env} for env, argv in fixed]
    )
    assert [rerun["exit"] for rerun in reruns] == [0] * len(fixed), reruns
    said_on = [result["plan"]["stock_starts"] for result in plans]
    assert said_on == [truth["starts"] for truth in stock], list(
        zip(cells, said_on, strict=True)
    )
