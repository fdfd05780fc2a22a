"""The decision rule of KV_PRECISION=compare (``scripts/lib/minimaxm3_paired.py``
and ``minimaxm3_compare.decide``): non-inferiority by a stated margin first,
harm tests and a breakage guard that can each block, and what the launch
scripts' default size shows, by simulation.

``tests/scripts/test_rule_mutants.py`` runs this file against mutated copies
of the rule: each mutant must fail some test here. MINIMAXM3_SCRIPTS_LIB
points the imports at such a copy."""

from __future__ import annotations

import math
import os
import random
import re
import statistics
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPTS_LIB = REPO / "scripts" / "lib"
LIB = Path(os.environ.get("MINIMAXM3_SCRIPTS_LIB") or SCRIPTS_LIB)
sys.path.insert(0, str(LIB))

import minimaxm3_compare as compare  # noqa: E402
import minimaxm3_logprobs as teacher_forced  # noqa: E402
import minimaxm3_paired as rule  # noqa: E402

LENGTHS = ("4096", "16384", "32768", "65536", "131072")
TASKS = ("niah_multikey_2", "niah_multikey_3", "ruler_vt")


def _script_default(name: str) -> str:
    script = (SCRIPTS_LIB / "minimaxm3_fp8_bench.sh").read_text(encoding="utf-8")
    return re.search(rf"^DEFAULT_{name}=\"?([^\"\n]*)\"?$", script, re.M).group(1)


# -- the tests the rule is made of ----------------------------------------------


def test_the_exact_mcnemar_p_value():
    assert rule.drop_p_value(0, 0) == 1.0
    assert rule.drop_p_value(8, 0) == 2**-8
    # 10 lost, 2 gained: P(X >= 10), X ~ Binomial(12, 1/2) = 79 / 4096.
    assert rule.drop_p_value(10, 2) == pytest.approx(79 / 4096)
    assert rule.drop_p_value(2, 10) > 0.99  # gains are no evidence of a drop


def test_counts_are_the_candidates_losses_and_gains():
    ours = {"a": True, "b": False, "c": False, "d": True}
    theirs = {"a": True, "b": True, "c": True, "d": False, "e": True}
    assert rule.counts(ours, theirs) == {"prompts": 4, "lost": 2, "gained": 1}
    assert rule.paired(ours, theirs)["p_value"] == rule.drop_p_value(2, 1)
    assert rule.counts({"x": True}, theirs) is None


def test_holm_steps_down_and_stops_at_the_first_it_cannot_reject():
    assert rule.holm({"a": 0.01, "b": 0.02, "c": 0.04}) == {"a", "b", "c"}
    assert rule.holm({"a": 0.01, "b": 0.06, "c": 0.001}) == {"a", "c"}
    assert rule.holm({"a": 0.02, "b": 0.02, "c": 0.02}) == set()


def test_the_harm_family_is_holms_over_the_tests_that_can_flag():
    tests = {
        name: {"kind": "ruler", "prompts": 600, "p_value": p}
        for name, p in (("a", 0.02), ("b", 0.03), ("c", 0.04))
    }
    # Each under 0.05 alone; Holm over three flags none.
    assert rule.harm_family(tests) == (["a", "b", "c"], [])
    # Five documents: the sign-flip test's smallest p is 1/32, under 0.05
    # alone but over 0.05 / 4, so it could never pass Holm's strictest step
    # in this family and is left out (spending no alpha).
    tests["lp"] = {"kind": "logprobs", "docs": 5, "p_value": 1 / 32}
    assert rule.harm_family(tests)[0] == ["a", "b", "c"]
    tests["lp"]["docs"] = 32
    assert "lp" in rule.harm_family(tests)[0]


def test_the_upper_bound_is_agresti_and_mins():
    # 30 lost, 10 gained of 1,000: half a prompt added to each cell, n 1,002;
    # drop 20/1,002 = 0.01996, variance (41/1,002 - drop^2)/1,002, z(0.95) 1.6449.
    assert rule.drop_upper_bound(30, 10, 1_000) == pytest.approx(3.0420, abs=1e-3)
    # No prompt told apart: the bound is still above zero, by the size alone.
    assert rule.drop_upper_bound(0, 0, 12) == pytest.approx(100 * 1.6449 / 14, 1e-3)
    assert rule.drop_upper_bound(0, 0, 1_200) < 0.2


def test_the_monte_carlo_sign_flip_at_the_default_size_flags_a_loss_and_not_noise():
    docs = int(_script_default("LOGPROB_EVAL_DOCS"))
    assert docs > rule.EXACT_UP_TO  # the default takes the Monte Carlo branch
    draw = random.Random(1)
    lost = [0.05 + draw.gauss(0.0, 0.02) for _ in range(docs)]
    p = rule.mean_above_p_value(lost, rule.LOGPROB_MARGIN_NATS)
    # Every draw's flipped sum is below the observed one: p is 1 / (draws + 1).
    assert p == 1 / (rule.MONTE_CARLO_DRAWS + 1)
    assert p < 0.05 / 13  # able to pass Holm's strictest step in any family here
    even = [draw.gauss(0.0, 0.02) for _ in range(docs)]
    assert rule.mean_above_p_value(even, rule.LOGPROB_MARGIN_NATS) > 0.5


def test_the_teacher_forced_margin_holds_no_noise_floor():
    def doc(runs):
        return {"runs": [{"mean_logprob": x, "top": {}} for x in runs]}

    reference = {"lengths": {"32768": [doc([-1.0, -1.0]) for _ in range(8)]}}
    # 0.05 nats a recall token lost on every document, with a pool whose two
    # runs differ by 0.08: the sign-flip null already holds that noise.
    noisy = {"lengths": {"32768": [doc([-1.05, -0.97]) for _ in range(8)]}}
    found = teacher_forced.compare(noisy, reference)["32768"]
    assert found["noise"] == pytest.approx(0.08)
    assert found["margin"] == rule.LOGPROB_MARGIN_NATS
    assert found["p_value"] == 2**-8


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_a_log_prob_that_is_not_finite_blocks(bad):
    def doc(mean):
        return {"runs": [{"mean_logprob": mean, "top": {}}] * 2}

    docs = int(_script_default("LOGPROB_EVAL_DOCS"))
    reference = {"lengths": {"131072": [doc(-1.0) for _ in range(docs)]}}
    # One document of 32 scored NaN or infinite by the candidate: breakage,
    # whatever the other 31 say.
    ours = {"lengths": {"131072": [doc(bad), *(doc(-1.0) for _ in range(docs - 1))]}}
    test = teacher_forced.compare(ours, reference)["131072"]
    assert test["p_value"] == 0.0
    tested = rule.assess({}, {"131072": test})
    assert tested["flagged"] == ["logprobs:131072"]


def test_the_bootstrap_interval_is_a_95_percent_one():
    draw = random.Random(2)
    values = [draw.gauss(0.0, 1.0) for _ in range(400)]
    low, high = rule.bootstrap_interval(values)
    # About 2 x 1.96 standard errors of the mean wide.
    expected = 2 * 1.96 * statistics.stdev(values) / 20
    assert high - low == pytest.approx(expected, rel=0.2)


def test_the_primary_pools_the_long_lengths_only():
    assert rule.primary_lengths([4_096, 16_384, 32_768, 65_536, 131_072]) == [
        65_536,
        131_072,
    ]
    assert rule.primary_lengths([4_096, 16_384]) == [16_384]


# -- the decision over a whole comparison -----------------------------------------


def _rows(docs, drop=None, redraw=0.1, seed=0, lengths=LENGTHS):
    """The reference and a candidate 10% faster with 1.32x the KV tokens:
    each RULER prompt right with chance 0.85 for the reference, the
    candidate's answer redrawn (right with chance 0.85) with chance
    ``redraw``, and losing ``drop[length]`` points of right answers there."""
    draw = random.Random(seed)
    drop = drop or {}
    reference, candidate = {}, {}
    for task in TASKS:
        for n in lengths:
            ours, theirs = {}, {}
            for i in range(docs):
                right = draw.random() < 0.85
                theirs[str(i)] = right
                mine = draw.random() < 0.85 if draw.random() < redraw else right
                ours[str(i)] = mine and draw.random() >= drop.get(n, 0) / 100 / 0.85
            for row, outcomes in ((reference, theirs), (candidate, ours)):
                row.setdefault(task, {})[n] = {
                    "accuracy": sum(outcomes.values()) / docs,
                    "docs": docs,
                    "outcomes": outcomes,
                }

    def row(pool, ruler, throughput, kv):
        return {
            "pool": pool, "ruler": ruler, "output_throughput": throughput,
            "kv_tokens": kv, "long_context": {}, "logprobs": {},
            "gsm8k": None, "gsm8k_stderr": None,
            "agreement": {"prompts": 40, "first_token_close": 40, "not_close": []},
        }  # fmt: skip

    return [
        row("stock", reference, 1000.0, 100),
        row("fp8", candidate, 1100.0, 132),
    ]


def test_a_run_too_small_to_show_non_inferiority_keeps_the_reference():
    # 4 prompts a task a length (12 a length), no effect: nothing can be
    # shown at this size, so nothing is called "not worse".
    decision = compare.decide(_rows(4))
    assert decision["run"] == "stock"
    why = decision["excluded"]["fp8"]
    assert why.startswith(
        "long-context accuracy not shown within 2 points at this size"
    )
    assert "about " in why and " paired prompts at those lengths show it" in why
    assert decision["reasons"][-1] == (
        "on throughput alone KV_PRECISION=fp8 is +10.0% output tok/s, its accuracy "
        "not shown (a choice on throughput, not this rule's)"
    )


def test_a_large_run_with_no_loss_picks_the_candidate():
    decision = compare.decide(_rows(200))
    assert decision["run"] == "fp8", decision
    assert decision["reasons"][0] == "+10.0% output tok/s vs stock"
    assert decision["reasons"][1].startswith(
        "long context not worse than stock by 2 points (RULER at 65,536 and "
        "131,072 tokens pooled, 1,200 paired prompts: drop "
    )


def test_a_3_point_drop_at_the_long_lengths_keeps_the_reference():
    drop = {"65536": 3.0, "131072": 3.0}
    decision = compare.decide(_rows(200, drop))
    assert decision["run"] == "stock"
    assert "fp8" in decision["excluded"]
    # Pooled with the three shorter lengths the same loss would pass: the
    # primary pools only where the index cache decides most.
    tested = compare.long_context_tests(*reversed(_rows(200, drop)))
    assert tested["primary"]["lengths"] == [65_536, 131_072]
    everything = rule._total(c for n in LENGTHS for c in compare.ruler_cells(
        _rows(200, drop)[1], _rows(200, drop)[0])[n].values())  # fmt: skip
    assert (
        rule.drop_upper_bound(
            everything["lost"], everything["gained"], everything["prompts"]
        )
        < rule.MARGIN_POINTS
    )


def test_a_loss_in_one_task_at_the_longest_length_is_its_own_test():
    rows = _rows(200)
    ruler = rows[1]["ruler"]["ruler_vt"]["131072"]
    lost = [doc for doc, right in ruler["outcomes"].items() if right][:40]
    for doc in lost:
        ruler["outcomes"][doc] = False
    tested = compare.long_context_tests(rows[1], rows[0])
    assert "ruler:131072:ruler_vt" in tested["flagged"]
    assert tested["verdict"] == "worse"
    assert compare.decide(rows)["run"] == "stock"


def test_quick_decides_nothing():
    decision = compare.decide(_rows(200), quick=True)
    assert decision["run"] == "stock"
    assert decision["excluded"]["fp8"].startswith("RUN_EVAL=quick decides nothing")


def test_broken_pass_code_retrieval_blocks_outside_alpha():
    rows = _rows(200)
    for row, right in ((rows[0], 30), (rows[1], 25)):
        row["long_context"]["16384"] = {
            "accuracy": right / 30, "stderr": 0.0, "docs": 30,
            "outcomes": {str(i): i < right for i in range(30)},
        }  # fmt: skip
    decision = compare.decide(rows)
    assert decision["excluded"]["fp8"] == (
        "pass-code retrieval broken (a net loss over 10 points): 16,384 tokens "
        "(lost 5, gained 0 of 30)"
    )


# -- the simulation behind the defaults ----------------------------------------------


def test_the_simulated_design_is_the_scripts_default_one():
    assert (
        tuple(int(n) for n in _script_default("LONG_EVAL_LENGTHS").split())
        == rule.SIMULATED_LENGTHS
    )
    assert len(_script_default("RULER_TASKS").split()) == rule.SIMULATED_TASKS
    assert int(_script_default("RULER_EVAL_DOCS")) == rule.DEFAULT_DOCS
    assert len(_script_default("LOGPROB_EVAL_LENGTHS").split()) == rule.LOGPROB_TESTS
    assert int(_script_default("LONG_EVAL_DOCS")) == rule.RETRIEVAL_PROMPTS
    assert float(_script_default("NONINFERIORITY_MARGIN")) == rule.MARGIN_POINTS


def _cell(name: str, disagreement: float, model: str = "redraw") -> float:
    scenario = next(s for s in rule.SCENARIOS if s.name == name)
    return rule.pick_rate(rule.Cell(scenario, disagreement, model))


NO_EFFECT = "no effect"
THREE_LONG = "3 points at the long lengths"
AT_MARGIN = "2 points at the long lengths (the margin)"
STATED_NOISE = 0.05
"""The run-to-run disagreement the defaults are sized for (docs/deploying.md)."""


@pytest.mark.parametrize("model", rule.MODELS)
def test_the_defaults_meet_the_targets_at_the_stated_noise(model):
    assert _cell(NO_EFFECT, STATED_NOISE, model) >= rule.TARGET_POWER
    assert _cell(THREE_LONG, STATED_NOISE, model) <= 1 - rule.TARGET_BLOCK
    # At the margin itself, non-inferiority is shown about ALPHA of the time.
    assert _cell(AT_MARGIN, STATED_NOISE, model) <= 2 * rule.ALPHA


def test_the_simulation_can_say_the_defaults_fall_short():
    # At 15% disagreement no default size shows a pool with no effect often
    # enough: the docs say what it costs.
    assert _cell(NO_EFFECT, 0.15) < rule.TARGET_POWER


def test_deploying_carries_the_simulated_table():
    deploying = (REPO / "docs" / "deploying.md").read_text(encoding="utf-8")
    assert "python3 scripts/lib/minimaxm3_paired.py simulate" in deploying
    for name in (NO_EFFECT, THREE_LONG):
        row = f"| {name} | " + " | ".join(
            " / ".join(f"{_cell(name, d, m):.1%}" for m in rule.MODELS)
            for d in rule.DISAGREEMENTS
        )
        assert row in deploying, row
