#!/usr/bin/env python3
"""The decision rule of KV_PRECISION=compare (standard library only).

Both pools answer the same long-context prompts, so only the prompts one got
right and the other wrong tell them apart. The rule asks one question first,
stated before the run: is the candidate's long-context accuracy lower than
the reference's by less than ``MARGIN_POINTS``? It picks the candidate on
accuracy grounds only if the run shows that; a run too small to show it says
"not shown at this size" and keeps the reference.

1. **Primary (non-inferiority)**: RULER's prompts, every task, at the long
   lengths (``PRIMARY_FROM`` tokens and up; the longest length that ran where
   ``MAX_MODEL_LEN`` keeps those out), paired prompt by prompt. Shown when the
   one-sided ``CONFIDENCE`` upper bound of the paired drop is under the margin
   (Agresti and Min's interval for matched proportions: the Wald interval
   after half a prompt is added to each cell of the 2x2 table). The bound's
   width comes from the prompts the pools disagreed on, so run-to-run noise
   widens it by itself; nothing is subtracted for noise.
2. **Secondary (each can block)**: one-sided harm tests, Holm at ``ALPHA``:
   RULER per length (exact McNemar), RULER per task at the longest length
   (so that a loss in one task does not hide in the pool) and the
   teacher-forced pass per length (sign-flip, mean loss over
   ``LOGPROB_MARGIN_NATS`` a recall token). A test whose smallest possible
   p-value cannot pass Holm's strictest step is left out of the family and
   reported as unable to flag at its size.
3. **Guard (outside alpha)**: pass-code retrieval, a smoke check for broken
   serving: a net loss of more than ``GUARD_POINTS`` at any length blocks.

``simulate`` checks the rule by simulation (no GPU): how often it picks the
candidate for spread, long-length, longest-length and one-task drops, at a
given run-to-run disagreement, with a noisier candidate, under two noise
models (docs/deploying.md carries its tables).

``python3 scripts/lib/minimaxm3_paired.py simulate [--runs N]``
"""

from __future__ import annotations

import argparse
import math
import random
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import cache
from statistics import NormalDist
from typing import Any

ALPHA = 0.05
"""Each decision's error rate: showing non-inferiority for a pool worse by
the margin (one-sided), and blocking a pool with no effect (family-wise)."""
CONFIDENCE = 1 - ALPHA
MARGIN_POINTS = 2.0
"""The default non-inferiority margin (NONINFERIORITY_MARGIN), in points."""
PRIMARY_FROM = 65_536
"""The primary pools RULER's lengths from here up: where the index cache
decides most (it keeps 2,048 tokens per query)."""
GUARD_POINTS = 10.0
"""Pass-code retrieval's breakage guard: a larger net loss at a length blocks."""
LOGPROB_MARGIN_NATS = 0.01
"""The teacher-forced test flags a mean loss above this, in nats a recall
token (about 1% of recall lines failed outright: minimaxm3_logprobs.py)."""
EXACT_UP_TO = 16
"""The sign-flip test is exact up to this many documents, Monte Carlo above."""
MONTE_CARLO_DRAWS = 20_000
TARGET_POWER = 0.80
"""The defaults aim to show non-inferiority for a pool with no effect this often."""
TARGET_BLOCK = 0.95
"""... and to keep out a pool 3 points worse at the long lengths this often."""


# -- the tests ----------------------------------------------------------------


def drop_p_value(lost: int, gained: int) -> float:
    """One-sided exact McNemar: the chance of at least ``lost`` losses among
    ``lost + gained`` discordant prompts if either pool is as likely to win
    each one."""
    discordant = lost + gained
    return sum(math.comb(discordant, k) for k in range(lost, discordant + 1)) / (
        2**discordant
    )


def holm(p_values: dict[Any, float], alpha: float = ALPHA) -> set[Any]:
    """The hypotheses Holm's step-down rejects at family-wise ``alpha``."""
    rejected = set()
    ordered = sorted(p_values.items(), key=lambda item: item[1])
    for rank, (name, p) in enumerate(ordered):
        if p > alpha / (len(ordered) - rank):
            break
        rejected.add(name)
    return rejected


def counts(ours: dict[str, bool], theirs: dict[str, bool]) -> dict[str, int] | None:
    """The prompts both pools answered, and those ``ours`` lost and gained
    against ``theirs``; None where they share no prompt."""
    shared = sorted(set(ours) & set(theirs))
    if not shared:
        return None
    return {
        "prompts": len(shared),
        "lost": sum(theirs[doc] and not ours[doc] for doc in shared),
        "gained": sum(ours[doc] and not theirs[doc] for doc in shared),
    }


def paired(ours: dict[str, bool], theirs: dict[str, bool]) -> dict[str, Any] | None:
    """:func:`counts` with the one-sided McNemar p-value of a drop."""
    found = counts(ours, theirs)
    if found is None:
        return None
    return {**found, "p_value": drop_p_value(found["lost"], found["gained"])}


def drop_upper_bound(
    lost: int, gained: int, prompts: int, level: float = CONFIDENCE
) -> float:
    """One-sided upper confidence bound, in points, on the paired drop (the
    reference's accuracy less the candidate's): Agresti and Min (2005), the
    Wald bound after adding half a prompt to each of the four cells."""
    n = prompts + 2
    drop = (lost - gained) / n
    variance = ((lost + gained + 1) / n - drop * drop) / n
    return 100 * (drop + NormalDist().inv_cdf(level) * math.sqrt(variance))


def mean_above_p_value(
    values: list[float], margin: float, draws: int = MONTE_CARLO_DRAWS, seed: int = 0
) -> float:
    """One-sided paired sign-flip test that the mean of ``values`` (per
    document, candidate's loss against the reference) exceeds ``margin``:
    under the null each document's excess over the margin is as likely
    negative as positive. Exact up to EXACT_UP_TO documents, else ``draws``
    random flips (seeded, with the observed one counted). A value that is
    not finite (a log-prob of -inf or NaN in either pool) is breakage: 0."""
    if not all(math.isfinite(value) for value in values):
        return 0.0
    excess = [value - margin for value in values]
    if not excess:
        return 1.0
    observed = sum(excess)
    if len(excess) <= EXACT_UP_TO:
        flips = range(2 ** len(excess))
        at_least = sum(
            sum(x if (mask >> i) & 1 else -x for i, x in enumerate(excess))
            >= observed - 1e-12
            for mask in flips
        )
        return at_least / 2 ** len(excess)
    draw = random.Random(seed)
    at_least = sum(
        sum(x if draw.random() < 0.5 else -x for x in excess) >= observed - 1e-12
        for _ in range(draws)
    )
    return (at_least + 1) / (draws + 1)


def bootstrap_interval(
    values: list[float], draws: int = 2_000, seed: int = 0, level: float = 0.95
) -> tuple[float, float] | None:
    """Percentile bootstrap interval of the mean of ``values`` (resampling
    documents); None for fewer than two."""
    if len(values) < 2:
        return None
    draw = random.Random(seed)
    means = sorted(
        sum(draw.choices(values, k=len(values))) / len(values) for _ in range(draws)
    )
    tail = (1 - level) / 2
    return means[int(tail * draws)], means[min(draws - 1, int((1 - tail) * draws))]


def smallest_p_value(test: dict[str, Any]) -> float:
    """The smallest p-value a test could return at its size."""
    if test["kind"] == "logprobs":
        docs = test["docs"]
        return 2.0**-docs if docs <= EXACT_UP_TO else 1 / (MONTE_CARLO_DRAWS + 1)
    return 0.5 ** test["prompts"]


def harm_family(
    tests: dict[str, dict[str, Any]], alpha: float = ALPHA
) -> tuple[list[str], list[str]]:
    """The tests kept in the family (those that could pass Holm's strictest
    step over the family kept) and those Holm flags among them."""
    kept = list(tests)
    while kept:
        able = [n for n in kept if smallest_p_value(tests[n]) <= alpha / len(kept)]
        if len(able) == len(kept):
            break
        kept = able
    flagged = holm({n: tests[n]["p_value"] for n in kept}, alpha)
    return kept, [n for n in kept if n in flagged]


# -- the decision ---------------------------------------------------------------


def primary_lengths(lengths: Iterable[int]) -> list[int]:
    """The RULER lengths the primary pools: PRIMARY_FROM and up, or the longest."""
    ran = sorted(lengths)
    return [n for n in ran if n >= PRIMARY_FROM] or ran[-1:]


def _total(cells: Iterable[dict[str, int]]) -> dict[str, int]:
    cells = list(cells)
    return {key: sum(c[key] for c in cells) for key in ("prompts", "lost", "gained")}


def assess(
    ruler: dict[str, dict[str, dict[str, int]]],
    logprobs: dict[str, dict[str, Any]] | None = None,
    retrieval: dict[str, dict[str, int]] | None = None,
    margin: float = MARGIN_POINTS,
    level: float = CONFIDENCE,
) -> dict[str, Any]:
    """The rule over one candidate's paired counts against the reference:
    ``ruler`` ``{length: {task: counts}}``, ``logprobs`` ``{length: test}``
    (``docs``, ``p_value``), ``retrieval`` ``{length: counts}``.

    ``verdict``: "broken" (the guard), "worse" (a secondary test flags),
    "shown" (non-inferior by the margin) or "not shown"."""
    lengths = sorted(ruler, key=int)
    primary = None
    if lengths:
        long = primary_lengths(int(n) for n in lengths)
        total = _total(c for n in long for c in ruler[str(n)].values())
        upper = drop_upper_bound(
            total["lost"], total["gained"], total["prompts"], level
        )
        primary = {
            "lengths": long,
            **total,
            "drop": 100 * (total["lost"] - total["gained"]) / total["prompts"],
            "upper": upper,
            "margin": margin,
            "shown": upper < margin,
        }
    tests: dict[str, dict[str, Any]] = {}
    for n in lengths:
        found = _total(ruler[n].values())
        tests[f"ruler:{n}"] = {
            "kind": "ruler",
            "length": n,
            **found,
            "p_value": drop_p_value(found["lost"], found["gained"]),
        }
    if lengths and len(ruler[lengths[-1]]) > 1:
        for task, found in sorted(ruler[lengths[-1]].items()):
            tests[f"ruler:{lengths[-1]}:{task}"] = {
                "kind": "ruler task",
                "length": lengths[-1],
                "task": task,
                **found,
                "p_value": drop_p_value(found["lost"], found["gained"]),
            }
    for n, test in sorted((logprobs or {}).items(), key=lambda t: int(t[0])):
        tests[f"logprobs:{n}"] = {"kind": "logprobs", "length": n, **test}
    family, flagged = harm_family(tests)
    guard = {
        n: {
            **found,
            "net_drop": 100 * (found["lost"] - found["gained"]) / found["prompts"],
        }
        for n, found in sorted((retrieval or {}).items(), key=lambda t: int(t[0]))
    }
    broken = [n for n, found in guard.items() if found["net_drop"] > GUARD_POINTS]
    verdict = (
        "broken"
        if broken
        else "worse"
        if flagged
        else "shown"
        if primary is not None and primary["shown"]
        else "not shown"
    )
    return {
        "verdict": verdict,
        "primary": primary,
        "tests": tests,
        "family": family,
        "flagged": flagged,
        "guard": guard,
        "broken": broken,
    }


def prompts_needed(
    disagreement: float,
    margin: float = MARGIN_POINTS,
    power: float = TARGET_POWER,
    level: float = CONFIDENCE,
) -> int:
    """Paired prompts at the long lengths for the primary to show
    non-inferiority of a pool with no effect in ``power`` of runs, where the
    pools disagree on ``disagreement`` of them (normal approximation)."""
    z = NormalDist().inv_cdf(level) + NormalDist().inv_cdf(power)
    return math.ceil(disagreement * (z / (margin / 100)) ** 2)


def wilson_interval(hits: int, total: int, level: float = 0.95) -> tuple[float, float]:
    """Wilson score interval of a proportion."""
    z = NormalDist().inv_cdf(1 - (1 - level) / 2)
    share = hits / total
    centre = (share + z * z / (2 * total)) / (1 + z * z / total)
    half = (
        z
        * math.sqrt(share * (1 - share) / total + z * z / (4 * total * total))
        / (1 + z * z / total)
    )
    return max(0.0, centre - half), min(1.0, centre + half)


# -- simulation ------------------------------------------------------------------

SIMULATED_LENGTHS = (4_096, 16_384, 32_768, 65_536, 131_072)
"""The launch scripts' default RULER lengths."""
ACCURACY_BY_LENGTH = (0.95, 0.93, 0.90, 0.85, 0.80)
"""The reference's RULER accuracy by length in the simulation: falling with
length, as long-context accuracy does."""
SIMULATED_TASKS = 3
LOGPROB_TESTS = 3
"""The teacher-forced tests in the family (one per default length), given no
power: uniform p-values, the most false alarms they can add."""
RETRIEVAL_PROMPTS, RETRIEVAL_ACCURACY = 30, 0.98
DISAGREEMENTS = (0.02, 0.05, 0.10, 0.15)
"""Run-to-run disagreement: the share of the long lengths' prompts two runs
of one pool answer differently."""
MODELS = ("redraw", "margin")
DEFAULT_DOCS = 200
SIZES = (100, 200, 400)


@dataclass(frozen=True)
class Scenario:
    name: str
    drop: float = 0.0
    """Points of accuracy the candidate loses where the drop lands."""
    where: str = "none"
    """``long``: the primary lengths; ``every``: every length; ``longest``;
    ``task``: one task at the longest length."""
    noisier: float = 1.0
    """The candidate's run-to-run disagreement over the reference's."""


SCENARIOS = (
    Scenario("no effect"),
    Scenario("noisier candidate (2x the disagreement), no cache effect", noisier=2.0),
    Scenario("1 point at every length", 1.0, "every"),
    Scenario("2 points at the long lengths (the margin)", 2.0, "long"),
    Scenario("3 points at the long lengths", 3.0, "long"),
    Scenario("3 points at the longest length only", 3.0, "longest"),
    Scenario("3 points in one task at the longest length", 3.0, "task"),
    Scenario("10 points in one task at the longest length", 10.0, "task"),
)


def _bisect(f: Callable[[float], float], low: float, high: float) -> float:
    """The root of an increasing ``f`` in [low, high] (an end where none)."""
    for _ in range(50):
        mid = (low + high) / 2
        low, high = (mid, high) if f(mid) < 0 else (low, mid)
    return (low + high) / 2


def _right(model: str, accuracy: float, noise: float, mu: float | None = None):
    """(weight, chance right) over prompts for one run of a pool.

    ``redraw``: each answer is redrawn (right with chance ``accuracy``) with
    chance ``noise``, independently per run; noise moves no accuracy.
    ``margin``: each prompt has a latent margin m ~ N(mu, 1) and a run
    answers right when m + noise * e > 0, e ~ N(0, 1) per run; ``mu`` puts
    the pool at ``accuracy`` unless given (a noisier candidate on the
    reference's prompts is less accurate where most prompts are easy)."""
    if model == "redraw":
        return [
            (accuracy, 1 - noise + noise * accuracy),
            (1 - accuracy, noise * accuracy),
        ]
    if mu is None:
        mu = NormalDist().inv_cdf(accuracy) * math.sqrt(1 + noise * noise)
    step = 16 / 160
    unit = NormalDist()
    return [
        (unit.pdf(z) * step, unit.cdf((mu + z) / noise))
        for z in (-8 + i * step for i in range(161))
    ]


def _disagreement(model: str, accuracy: float, noise: float) -> float:
    return sum(w * 2 * p * (1 - p) for w, p in _right(model, accuracy, noise))


@cache
def _noise(model: str, disagreement: float) -> float:
    """The noise parameter at which two runs of one pool disagree on
    ``disagreement`` of the long lengths' prompts (saturating where the
    model cannot disagree that much)."""
    long = [a for n, a in zip(SIMULATED_LENGTHS, ACCURACY_BY_LENGTH, strict=True)
            if n >= PRIMARY_FROM]  # fmt: skip

    def excess(noise: float) -> float:
        found = [_disagreement(model, a, noise) for a in long]
        return sum(found) / len(found) - disagreement

    return _bisect(excess, 1e-3, 1.0 if model == "redraw" else 20.0)


@cache
def _lost_gained(
    model: str, accuracy: float, disagreement: float, noisier: float, drop: float
) -> tuple[float, float]:
    """The chances a prompt is lost and gained by the candidate."""
    noise = _noise(model, disagreement)
    reference = _right(model, accuracy, noise)
    mu = NormalDist().inv_cdf(accuracy) * math.sqrt(1 + noise * noise)
    candidate = _right(model, accuracy, _noise(model, disagreement * noisier), mu)
    candidate_accuracy = sum(w * p for w, p in candidate)
    keep = 1 - drop / 100 / candidate_accuracy
    lost = gained = 0.0
    for (w, r), (_, c) in zip(reference, candidate, strict=True):
        lost += w * r * (1 - c * keep)
        gained += w * (1 - r) * c * keep
    return lost, gained


@dataclass(frozen=True)
class Cell:
    scenario: Scenario
    disagreement: float
    model: str = "redraw"
    docs: int = DEFAULT_DOCS


def _drop_at(scenario: Scenario, length_index: int, task: int) -> float:
    longest = length_index == len(SIMULATED_LENGTHS) - 1
    long = SIMULATED_LENGTHS[length_index] >= PRIMARY_FROM
    lands = {
        "none": False,
        "every": True,
        "long": long,
        "longest": longest,
        "task": longest and task == 0,
    }[scenario.where]
    return scenario.drop if lands else 0.0


def obrien_fleming(alpha: float = ALPHA) -> tuple[float, float]:
    """One-sided O'Brien-Fleming bounds for two equally spaced looks: c * sqrt(2)
    at half the information, c at all of it, with P(either crossed) = alpha
    under the null (the two statistics correlate by sqrt(1/2))."""
    rho = math.sqrt(0.5)
    unit = NormalDist()
    step = 0.01

    def crossed(c: float) -> float:
        # 1 - P(Z1 <= c * sqrt(2), Z2 <= c), integrating over Z1.
        first = c * math.sqrt(2)
        below = sum(
            unit.pdf(z) * unit.cdf((c - rho * z) / math.sqrt(1 - rho * rho)) * step
            for z in (-8 + (i + 0.5) * step for i in range(int((first + 8) / step)))
        )
        return alpha - (1 - below)

    c = _bisect(crossed, 1.0, 4.0)
    return c * math.sqrt(2), c


@dataclass(frozen=True)
class Outcome:
    picked: float
    """The share of runs that pick the candidate (the fixed design)."""
    picked_interim: float
    """... with one interim look at half the long lengths' prompts."""
    spent_interim: float
    """The long lengths' prompts that design spends, as a share of the fixed one's."""


@cache
def simulate(cell: Cell, runs: int = 400) -> Outcome:
    """``runs`` simulated comparisons, seeded by the cell alone. Each run is
    judged twice on the same answers: the fixed design (the rule as the
    report runs it) and a group-sequential one (an interim look at half the
    long lengths' prompts: stop there if non-inferiority shows at the first
    O'Brien-Fleming bound, or for futility if the drop is at the margin or
    beyond; else go on to the second bound)."""
    scenario = cell.scenario
    chances = {}
    for i, accuracy in enumerate(ACCURACY_BY_LENGTH):
        for task in range(SIMULATED_TASKS):
            chances[i, task] = _lost_gained(
                cell.model,
                accuracy,
                cell.disagreement,
                scenario.noisier,
                _drop_at(scenario, i, task),
            )
    # Pass-code retrieval at its own accuracy, with the same noise.
    retrieval = _lost_gained(
        cell.model, RETRIEVAL_ACCURACY, cell.disagreement, 1.0, 0.0
    )
    draw = random.Random(
        f"{scenario.name}:{cell.disagreement}:{cell.model}:{cell.docs}"
    )
    first_bound, second_bound = (NormalDist().cdf(c) for c in obrien_fleming())

    def sample(prompts: int, lost: float, gained: float) -> dict[str, int]:
        found = {"prompts": prompts, "lost": 0, "gained": 0}
        for _ in range(prompts):
            u = draw.random()
            if u < lost:
                found["lost"] += 1
            elif u < lost + gained:
                found["gained"] += 1
        return found

    half = cell.docs // 2
    picked = picked_interim = spent = 0.0
    for _ in range(runs):
        halves = {
            (n, task): (
                sample(half, *chances[i, task]),
                sample(cell.docs - half, *chances[i, task]),
            )
            for i, n in enumerate(SIMULATED_LENGTHS)
            for task in range(SIMULATED_TASKS)
        }
        ruler = {
            str(n): {
                f"task{task}": _total(halves[n, task])
                for task in range(SIMULATED_TASKS)
            }
            for n in SIMULATED_LENGTHS
        }
        logprobs = {
            str(k): {"docs": 32, "p_value": draw.random()} for k in range(LOGPROB_TESTS)
        }
        guard = {
            str(n): sample(RETRIEVAL_PROMPTS, *retrieval) for n in SIMULATED_LENGTHS
        }
        picked += assess(ruler, logprobs, guard)["verdict"] == "shown"
        # The interim look: the long lengths at half their prompts.
        early = {
            str(n): (
                {f"task{t}": halves[n, t][0] for t in range(SIMULATED_TASKS)}
                if n >= PRIMARY_FROM
                else ruler[str(n)]
            )
            for n in SIMULATED_LENGTHS
        }
        look = assess(early, logprobs, guard, level=first_bound)
        if look["primary"]["shown"] or look["primary"]["drop"] >= MARGIN_POINTS:
            picked_interim += look["verdict"] == "shown"
            spent += 0.5
        else:
            final = assess(ruler, logprobs, guard, level=second_bound)
            picked_interim += final["verdict"] == "shown"
            spent += 1.0
    return Outcome(picked / runs, picked_interim / runs, spent / runs)


def pick_rate(cell: Cell, runs: int = 400) -> float:
    """The share of ``runs`` simulated comparisons in which the rule picks
    the candidate (verdict "shown")."""
    return simulate(cell, runs).picked


def simulate_tables(runs: int) -> list[str]:
    lines = [
        f"Share of simulated comparisons that pick the candidate ({runs} per cell; "
        f"RULER_EVAL_DOCS={DEFAULT_DOCS}, {SIMULATED_TASKS} tasks at "
        f"{len(SIMULATED_LENGTHS)} lengths, the reference right on "
        + "/".join(f"{a:.2f}" for a in ACCURACY_BY_LENGTH)
        + f" of prompts by length; margin {MARGIN_POINTS:g} points; cells "
        "redraw / margin noise model), by run-to-run disagreement at the long lengths:",
        "",
        "| scenario | " + " | ".join(f"{d:.0%}" for d in DISAGREEMENTS) + " |",
        "| --- |" + " --- |" * len(DISAGREEMENTS),
    ]
    for scenario in SCENARIOS:
        cells = [
            " / ".join(
                f"{pick_rate(Cell(scenario, d, model), runs):.1%}" for model in MODELS
            )
            for d in DISAGREEMENTS
        ]
        lines.append(f"| {scenario.name} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "By size (redraw model): no effect picked / 3 points at the long lengths "
        "picked, by run-to-run disagreement:",
        "",
        "| RULER_EVAL_DOCS (prompts at the long lengths) | "
        + " | ".join(f"{d:.0%}" for d in DISAGREEMENTS)
        + " |",
        "| --- |" + " --- |" * len(DISAGREEMENTS),
    ]
    for docs in SIZES:
        cells = [
            " / ".join(
                f"{pick_rate(Cell(SCENARIOS[i], d, 'redraw', docs), runs):.1%}"
                for i in (0, 4)
            )
            for d in DISAGREEMENTS
        ]
        long = sum(n >= PRIMARY_FROM for n in SIMULATED_LENGTHS)
        lines.append(
            f"| {docs} ({docs * SIMULATED_TASKS * long}) | " + " | ".join(cells) + " |"
        )
    first, second = obrien_fleming()
    lines += [
        "",
        "One interim look at half the long lengths' prompts (O'Brien-Fleming, "
        f"z {first:.3f} then {second:.3f}; stop for futility at a drop of the margin "
        "or more), redraw model: picked, and the long lengths' prompts spent as a "
        "share of the fixed design's, by run-to-run disagreement:",
        "",
        "| scenario | " + " | ".join(f"{d:.0%}" for d in DISAGREEMENTS) + " |",
        "| --- |" + " --- |" * len(DISAGREEMENTS),
    ]
    for i in (0, 3, 4):
        cells = []
        for d in DISAGREEMENTS:
            found = simulate(Cell(SCENARIOS[i], d), runs)
            cells.append(f"{found.picked_interim:.1%} ({found.spent_interim:.0%})")
        lines.append(f"| {SCENARIOS[i].name} | " + " | ".join(cells) + " |")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    sim = commands.add_parser("simulate", help="the rule's pick rates by simulation")
    sim.add_argument("--runs", type=int, default=400)
    primary = commands.add_parser(
        "primary", help="of the RULER lengths that run, those the primary pools"
    )
    primary.add_argument("--lengths", required=True, help="space-separated tokens")
    args = parser.parse_args(argv)
    if args.command == "primary":
        print(" ".join(map(str, primary_lengths(int(n) for n in args.lengths.split()))))
        return 0
    print("\n".join(simulate_tables(args.runs)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
