"""The benchmarks that need a GPU say so plainly where there is none, and the
decode benchmark plans, and checks, what it would time on each GPU."""

from __future__ import annotations

import pytest

from vllm_minimax_m3_kv_sim.plumbing.children import run_python


def test_the_decode_scorer_benchmark_times_nothing_without_a_gpu():
    import torch  # here, not at collection: the fast tier imports no torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is here: it would time")
    proc = run_python(["-m", "benchmarks.decode_scorer"], {}, 120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip().startswith("no GPU in this process: nothing timed")


PLAN = """
import json, sys
from vllm_minimax_m3_kv_sim.hardware import simulate
simulate(sys.argv[1])
from benchmarks.decode_scorer import main
sys.exit(main(["--plan", "--json"]))
"""


def _plan(hardware: str) -> dict:
    import json

    proc = run_python(["-c", PLAN, hardware], {}, 300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _arms(row: dict) -> dict[str, dict]:
    return {arm["name"]: arm for arm in row["arms"]}


def test_the_decode_plan_times_the_fnuz_cache_and_the_writer_on_mi300x():
    plan = _plan("mi300x")
    assert plan["problems"] == []
    assert plan["fp8"] == "torch.float8_e4m3fnuz"  # what gfx942 serves
    assert plan["writer_row"]
    # gfx942's policy is the same for both dtypes: one launch, two arms.
    assert all(len(row["arms"]) == 2 for row in plan["rows"])
    assert {row["query_len"] for row in plan["rows"]} == {1, 2}


def test_the_decode_plan_compares_dtypes_at_one_launch_and_at_vllms_on_mi355x():
    plan = _plan("mi355x")
    assert plan["problems"] == [] and plan["fp8"] == "torch.float8_e4m3fn"
    assert not plan["writer_row"]
    rows = {(r["batch"], r["context"], r["query_len"]): r for r in plan["rows"]}
    assert {q for *_, q in rows} == {1, 2}  # MTP verification rows
    # 1-11 requests: vLLM tunes bf16 ("balanced"), fp8 takes split-K; the
    # same-launch arm runs bf16 as vLLM runs fp8, and fp8 as it runs bf16.
    low = _arms(rows[(1, 8192, 1)])
    assert low["bf16"]["launch"].startswith("balanced")
    assert low["fp8"]["launch"].startswith("split-K")
    assert low["bf16 at fp8's launch"]["launch"] == low["fp8"]["launch"]
    assert low["fp8 at bf16's launch"]["launch"] == low["bf16"]["launch"]
    # 20-64 requests: bf16's high-batch configuration, which fp8 lacks.
    high = _arms(rows[(32, 8192, 1)])
    assert high["bf16"]["launch"].endswith("high-batch")
    assert high["bf16 at fp8's launch"]["launch"] == high["fp8"]["launch"]
    for row in plan["rows"]:
        assert row["index_k_bytes"]["bf16"] == 2 * row["index_k_bytes"]["fp8"]


def test_the_decode_plan_is_one_launch_per_dtype_on_cuda():
    plan = _plan("h200")
    assert plan["problems"] == [] and not plan["writer_row"]
    assert all(len(row["arms"]) == 2 for row in plan["rows"])


def test_the_h200_decode_table_in_the_docs_is_the_committed_runs():
    # docs/performance.md carries the table --render prints for the device
    # check's committed run; a rerun that changes it changes both.
    from vllm_minimax_m3_kv_sim import REPO

    proc = run_python(
        ["-m", "benchmarks.decode_scorer", "--render",
         str(REPO / "tests/data/device_records/h200.json")],
        {}, 120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    table = proc.stdout.strip()
    assert "on NVIDIA H200" in table
    assert "| 64    | 131,072 | 1 of 1 | 487.0   | 258.5  | 0.53x" in table
    assert table in (REPO / "docs" / "performance.md").read_text(encoding="utf-8")
