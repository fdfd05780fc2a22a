"""The benchmarks that need a GPU say so plainly where there is none, and the
decode benchmark plans, and checks, what it would time on each GPU."""

from __future__ import annotations

import pytest

from vllm_minimax_m3_kv_sim.plumbing.children import run_python


def test_bench_times_nothing_without_a_gpu_and_says_so_by_its_exit():
    import torch  # here, not at collection: the fast tier imports no torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is here: it would time")
    proc = run_python(["-m", "vllm_minimax_m3_kv", "bench", "--quick"], {}, 120)
    # Exit 2, not 0: a run that timed nothing is no measurement.
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "no GPU in this process: nothing timed" in proc.stderr
    assert proc.stdout.startswith("Would time vLLM's decode index scorer")


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
    return json.loads(proc.stdout)


TARGET_PLANS = """
import contextlib, io, json
from vllm_minimax_m3_kv.entrypoints.cli.main import main
plans = {}
for target in ("mi355x", "mi300x", "h200", "a100"):
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(["bench", "--plan", "--target", target, "--json"])
    plans[target] = {**json.loads(out.getvalue()), "code": code}
print(json.dumps(plans))
"""


@pytest.fixture(scope="module")
def target_plans() -> dict:
    import json

    proc = run_python(["-c", TARGET_PLANS], {}, 300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("target", ["mi355x", "mi300x", "h200"])
def test_bench_plans_for_a_target_as_on_that_gpu(target, target_plans):
    # `bench --plan --target T` here asks vLLM's policy functions for T's
    # scorers; the same plan as on T's (simulated) platform itself.
    planned, on_it = target_plans[target], _plan(target)
    assert planned["code"] == 0 and planned["problems"] == []
    assert planned["rows"] == on_it["rows"] and planned["fp8"] == on_it["fp8"]
    assert planned["writer_row"] == on_it["writer_row"]


def test_bench_refuses_to_plan_for_a_gpu_without_an_fp8_index_cache(target_plans):
    plan = target_plans["a100"]
    assert plan["code"] == 1
    assert plan["problems"][0] == "CUDA sm_80 (A100) serves no fp8 index cache"


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


def _rendered(module: str, record: str, *command: str) -> tuple[str, str]:
    """What ``module [command] --render`` prints for a committed GPU run, and
    docs/performance.md."""
    from vllm_minimax_m3_kv_sim import REPO

    run = REPO / "tests" / "data" / "device_records" / record
    proc = run_python(["-m", module, *command, "--render", str(run)], {}, 120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    performance = (REPO / "docs" / "performance.md").read_text(encoding="utf-8")
    return proc.stdout.strip(), performance


def test_the_h200_decode_table_in_the_docs_is_the_committed_runs():
    # docs/performance.md carries the table --render prints for the device
    # check's committed run; a rerun that changes it changes both.
    table, performance = _rendered("vllm_minimax_m3_kv", "h200.json", "bench")
    assert "on NVIDIA H200" in table
    assert "| 64    | 131,072 | 1 of 1 | 487.0   | 258.5  | 0.53x" in table
    assert table in performance


# -- needle retention: its paired statistics ------------------------------------


def test_needle_retention_pairs_choices_by_haystack():
    from benchmarks.needle_retention import paired_change

    reference = [[True, True, False], [True, False, False]]
    arm = [[True, False, True], [True, False, False]]
    change = paired_change(arm, reference)
    assert (change["lost"], change["gained"]) == (1, 1)
    assert change["change_points"] == 0.0
    assert (change["kept"], change["kept_reference"], change["rows"]) == (3, 3, 6)
    same = paired_change(reference, reference)
    assert same["interval"] == [0.0, 0.0]
    with pytest.raises(ValueError, match="different choices"):
        paired_change([[True]], [[True, False]])


def _simulated_haystacks(loss: float | None, seed: int, haystacks: int = 100) -> tuple:
    # Choices near the cut as the faint needle's: a haystack's difficulty is
    # shared by its seven choices (correlated, as real ones). The arm loses
    # each choice the reference kept with probability ``loss``; with None it
    # is a second draw from the reference's own distribution (no effect,
    # only noise, as the null arms).
    import random

    draw = random.Random(seed)
    reference, arm = [], []
    for _ in range(haystacks):
        chance = 0.2 + 0.8 * draw.random()
        theirs = [draw.random() < chance for _ in range(7)]
        if loss is None:
            ours = [draw.random() < chance for _ in range(7)]
        else:
            ours = [kept and draw.random() >= loss for kept in theirs]
        reference.append(theirs)
        arm.append(ours)
    return arm, reference


def test_the_needle_interval_covers_no_effect_and_sees_a_real_loss():
    from benchmarks.needle_retention import paired_change

    runs = 30
    covered = sum(
        lo <= 0.0 <= hi
        for lo, hi in (
            paired_change(*_simulated_haystacks(None, seed), seed=seed)["interval"]
            for seed in range(runs)
        )
    )
    assert covered >= 0.85 * runs  # a 95% interval; 30 runs
    # A 10% loss of kept choices (about 6 points) at 100 haystacks x 7.
    seen = sum(
        paired_change(*_simulated_haystacks(0.1, seed), seed=seed)["interval"][1] < 0
        for seed in range(runs)
    )
    assert seen >= 0.8 * runs


def test_the_needle_margin_is_what_the_needle_must_beat():
    from benchmarks.needle_retention import fp64_margin

    scores = [5.0, 1.0, 4.0, 3.0, 9.0]  # five blocks, the last one the query's
    # top-3 with the last block forced: two places for blocks 0-3.
    assert (
        fp64_margin(scores, needle=2, position=4 * 128, topk=3, local_blocks=1) == 1.0
    )
    assert (
        fp64_margin(scores, needle=1, position=4 * 128, topk=3, local_blocks=1) == -3.0
    )
    forced = fp64_margin(scores, needle=4, position=4 * 128, topk=3, local_blocks=1)
    assert forced == float("inf")


def test_the_h200_needle_table_in_the_docs_is_the_committed_runs():
    from vllm_minimax_m3_kv_sim import REPO

    table, performance = _rendered("benchmarks.needle_retention", "needle_h200.json")
    assert "200 x 7" in table and "on NVIDIA H200" in table
    # The README's figures are rows of this run.
    assert "| faint             | 200 x 7             | 0.558      | -0.09" in table
    assert "65 / 33       | -2.3 [-3.9, -0.6]" in table
    assert "16 / 13       | -0.2 [-1.0, +0.6]" in table
    assert table in performance
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert "-2.3 [-3.9, -0.6] (65 / 33)" in readme
    assert "0.514" not in readme + performance


def test_indexer_fidelity_pools_a_cell_over_its_sequences():
    from benchmarks.indexer_fidelity import _pooled

    runs = [
        {"context": 8192, "distribution": "rms", "queries": 4, "recall_min": r,
         "recall_mean": m, "regret_max": g, "attention_rel_diff_max": a,
         "plugin_layout_identical": True}
        for r, m, g, a in ((0.9, 0.95, 0.01, 0.2), (1.0, 1.0, 0.0, 0.1),
                           (0.8, 0.9, 0.03, 0.4))
    ]  # fmt: skip
    cell = _pooled(runs)
    assert (cell["sequences"], cell["queries"]) == (3, 4)
    assert cell["recall_min"] == 0.8 and cell["regret_max"] == 0.03
    assert cell["recall_mean"] == pytest.approx(0.95)
    low, high = cell["recall_interval"]
    assert 0.9 <= low < 0.95 < high <= 1.0
