"""The paired decision rule of KV_PRECISION=compare
(``scripts/lib/minimaxm3_paired.py``): its test, its family-wise control, and
what it can detect at the launch scripts' default size, by simulation."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
LIB = REPO / "scripts" / "lib"
sys.path.insert(0, str(LIB))

import minimaxm3_paired as rule  # noqa: E402


def _script_default(name: str) -> str:
    script = (LIB / "minimaxm3_fp8_bench.sh").read_text(encoding="utf-8")
    return re.search(rf"^DEFAULT_{name}=\"?([^\"\n]*)\"?$", script, re.M).group(1)


def _default_prompts() -> int:
    """RULER prompts per length at the launch scripts' defaults: every task's
    RULER_EVAL_DOCS, pooled."""
    tasks = _script_default("RULER_TASKS").split()
    assert len(tasks) == rule.DEFAULT_FAMILY["tasks"]
    return int(_script_default("RULER_EVAL_DOCS")) * len(tasks)


def test_the_simulated_family_is_the_scripts_default_one():
    # RULER at every default length (all standard ones), pass-code retrieval
    # at the same lengths and the teacher-forced pass at its own: the rest.
    ruler_lengths = _script_default("LONG_EVAL_LENGTHS").split()
    logprob_lengths = _script_default("LOGPROB_EVAL_LENGTHS").split()
    assert rule.DEFAULT_FAMILY["lengths"] == len(ruler_lengths)
    assert rule.DEFAULT_FAMILY["other_tests"] == len(ruler_lengths) + len(
        logprob_lengths
    )


def test_the_exact_mcnemar_p_value():
    assert rule.drop_p_value(0, 0) == 1.0
    assert rule.drop_p_value(8, 0) == 2**-8
    # 10 lost, 2 gained: P(X >= 10), X ~ Binomial(12, 1/2) = 79 / 4096.
    assert rule.drop_p_value(10, 2) == pytest.approx(79 / 4096)
    assert rule.drop_p_value(2, 10) > 0.99  # gains are no evidence of a drop


def test_holm_steps_down_and_stops_at_the_first_it_cannot_reject():
    assert rule.holm({"a": 0.01, "b": 0.02, "c": 0.04}) == {"a", "b", "c"}
    assert rule.holm({"a": 0.01, "b": 0.06, "c": 0.001}) == {"a", "c"}
    assert rule.holm({"a": 0.02, "b": 0.02, "c": 0.02}) == set()


def test_the_smallest_flagged_drop_is_what_the_test_would_flag():
    # 400 prompts, no gains, 5 lengths: 7 losses (2^-7 < 0.01), 1.75 points.
    assert rule.smallest_flagged_drop(400, 0, 5) == 1.75
    assert rule.smallest_flagged_drop(4, 0, 3) is None  # 2^-4 > 0.05 / 3
    # Gains the run saw raise it: noise both ways needs a larger net loss.
    assert rule.smallest_flagged_drop(400, 10, 5) > 1.75


def test_at_the_default_size_no_effect_is_rarely_flagged_and_3_points_mostly_are():
    prompts = _default_prompts()
    assert rule.flag_rate(prompts, 0.0, runs=400) <= 0.05
    assert rule.flag_rate(prompts, 0.03, runs=400) >= 0.80


def test_a_quick_run_is_a_smoke_check_only():
    # RUN_EVAL=quick's 10 prompts a task: even a 5-point drop is not seen
    # more often than a pool with no effect is flagged.
    assert rule.flag_rate(30, 0.05, runs=200) <= rule.flag_rate(30, 0.0, runs=200)


def test_deploying_carries_the_simulated_table():
    deploying = (REPO / "docs" / "deploying.md").read_text(encoding="utf-8")
    assert "python3 scripts/lib/minimaxm3_paired.py simulate" in deploying
    prompts = _default_prompts()
    docs = int(_script_default("RULER_EVAL_DOCS"))
    row = f"| {docs} ({prompts}) | " + " | ".join(
        f"{rule.flag_rate(prompts, drop, 400):.1%}" for drop in rule.SIMULATED_DROPS
    )
    assert row in deploying
    family = rule.DEFAULT_FAMILY["lengths"] + rule.DEFAULT_FAMILY["other_tests"]
    smallest = rule.smallest_flagged_drop(prompts, 0, family)
    assert f"flag at a RULER length is {smallest} points (" in deploying
