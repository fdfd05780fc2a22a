"""Each way the compare rule could be wrong is caught: a mutated copy of
``scripts/lib`` per mutant, and ``tests/scripts/test_paired_rule.py`` run
against it must fail (and pass against the unmutated copy)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
RULE_TESTS = REPO / "tests" / "scripts" / "test_paired_rule.py"

PAIRED, COMPARE, LOGPROBS = (
    "minimaxm3_paired.py",
    "minimaxm3_compare.py",
    "minimaxm3_logprobs.py",
)
MUTANTS: dict[str, tuple[str, str, str]] = {
    "the Monte Carlo sign test flipped": (
        PAIRED,
        "sum(x if draw.random() < 0.5 else -x for x in excess) >= observed - 1e-12",
        "sum(x if draw.random() < 0.5 else -x for x in excess) <= observed + 1e-12",
    ),
    "a non-finite log-prob read as a number": (
        PAIRED,
        "    if not all(math.isfinite(value) for value in values):\n        return 0.0\n",
        "",
    ),
    "200 Monte Carlo draws": (
        PAIRED,
        "MONTE_CARLO_DRAWS = 20_000",
        "MONTE_CARLO_DRAWS = 200",
    ),
    "the Monte Carlo p-value without its +1": (
        PAIRED,
        "return (at_least + 1) / (draws + 1)",
        "return at_least / draws",
    ),
    "Holm dropped from the harm family": (
        PAIRED,
        'flagged = holm({n: tests[n]["p_value"] for n in kept}, alpha)',
        'flagged = {n for n in kept if tests[n]["p_value"] <= alpha}',
    ),
    "lost and gained swapped": (
        PAIRED,
        '"lost": sum(theirs[doc] and not ours[doc] for doc in shared),\n'
        '        "gained": sum(ours[doc] and not theirs[doc] for doc in shared),',
        '"lost": sum(ours[doc] and not theirs[doc] for doc in shared),\n'
        '        "gained": sum(theirs[doc] and not ours[doc] for doc in shared),',
    ),
    "the log-prob margin with 3x the rerun noise": (
        LOGPROBS,
        "margin = TOLERANCE_NATS\n",
        "margin = 3 * noise + TOLERANCE_NATS\n",
    ),
    "a test kept at a one-test family's threshold": (
        PAIRED,
        "smallest_p_value(tests[n]) <= alpha / len(kept)",
        "smallest_p_value(tests[n]) <= alpha",
    ),
    "a 50% bootstrap interval printed as the 95% one": (
        PAIRED,
        "draws: int = 2_000, seed: int = 0, level: float = 0.95",
        "draws: int = 2_000, seed: int = 0, level: float = 0.5",
    ),
    "a 75% upper bound for the 95% one": (
        PAIRED,
        "CONFIDENCE = 1 - ALPHA",
        "CONFIDENCE = 1 - 5 * ALPHA",
    ),
    "no Agresti-Min adjustment": (
        PAIRED,
        "n = prompts + 2\n    drop = (lost - gained) / n\n"
        "    variance = ((lost + gained + 1) / n",
        "n = prompts\n    drop = (lost - gained) / n\n    variance = ((lost + gained) / n",
    ),
    "the primary pooled over every length": (
        PAIRED,
        "return [n for n in ran if n >= PRIMARY_FROM] or ran[-1:]",
        "return ran",
    ),
    "no per-task test at the longest length": (
        PAIRED,
        "if lengths and len(ruler[lengths[-1]]) > 1:",
        "if False:",
    ),
    "absence of a flag read as non-inferiority": (
        PAIRED,
        'if primary is not None and primary["shown"]',
        "if True",
    ),
    "the breakage guard never blocks": (
        PAIRED,
        'found["net_drop"] > GUARD_POINTS',
        'found["net_drop"] > 100 + GUARD_POINTS',
    ),
    "RUN_EVAL=quick decides": (
        COMPARE,
        "        elif quick:\n",
        "        elif quick and False:\n",
    ),
}


def _rule_tests_against(lib: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider",
         "-p", "no:xdist", str(RULE_TESTS)],
        cwd=REPO, capture_output=True, text=True, timeout=300,
        env={**os.environ, "MINIMAXM3_SCRIPTS_LIB": str(lib)},
    )  # fmt: skip


def _copy(tmp_path: Path) -> Path:
    lib = tmp_path / "lib"
    shutil.copytree(REPO / "scripts" / "lib", lib)
    return lib


def test_the_rule_tests_pass_on_the_rule_as_it_is(tmp_path):
    proc = _rule_tests_against(_copy(tmp_path))
    assert proc.returncode == 0, proc.stdout[-3000:]


@pytest.mark.parametrize("mutant", MUTANTS)
def test_each_mutant_of_the_rule_fails_a_rule_test(tmp_path, mutant):
    name, old, new = MUTANTS[mutant]
    lib = _copy(tmp_path)
    source = (lib / name).read_text(encoding="utf-8")
    assert source.count(old) == 1, f"the mutant's site moved: {old!r}"
    (lib / name).write_text(source.replace(old, new), encoding="utf-8")
    proc = _rule_tests_against(lib)
    assert proc.returncode == 1, proc.stdout[-3000:]
    failed = [line for line in proc.stdout.splitlines() if line.startswith("FAILED")]
    assert failed, proc.stdout[-3000:]
