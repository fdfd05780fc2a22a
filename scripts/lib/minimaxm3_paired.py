#!/usr/bin/env python3
"""The paired decision rule of KV_PRECISION=compare (standard library only).

Both pools answer the same long-context prompts; per length, the prompts one
pool got right and the other wrong are all that can tell them apart. An
exact one-sided McNemar test asks whether the candidate lost more of those
than chance allows; Holm's step-down keeps the chance of flagging any length
of a pool that is as good as the reference at most ``ALPHA`` over all the
tests together (every task at every length, and the teacher-forced
log-prob pass, whose per-document losses take a sign-flip test against the
server's own rerun noise).

``simulate`` checks the rule by simulation (no GPU): how often it flags a
pool with no effect, and one that loses a given share of prompts at the
longest lengths, at a given size, with both pools' answers partly
nondeterministic (docs/deploying.md carries its table).

``python3 scripts/lib/minimaxm3_paired.py simulate [--docs N ...] [--runs N]``
"""

from __future__ import annotations

import argparse
import math
import random
from typing import Any

ALPHA = 0.05
"""Family-wise: the chance of flagging any length of a pool with no effect."""
DEFAULT_FAMILY = {"lengths": 5, "tasks": 3, "other_tests": 8}
"""The launch scripts' default family at MAX_MODEL_LEN 131,088 or more: RULER
at the 5 default lengths (3 tasks pooled per length), then 8 tests given no
power: pass-code retrieval at the same 5 (a smoke check at 30 prompts) and
the teacher-forced pass at 3."""


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


def paired(ours: dict[str, bool], theirs: dict[str, bool]) -> dict[str, Any] | None:
    """One length: the prompts both pools answered, lost and gained by
    ``ours``, and the p-value; None where they share no prompt."""
    shared = sorted(set(ours) & set(theirs))
    if not shared:
        return None
    lost = sum(theirs[doc] and not ours[doc] for doc in shared)
    gained = sum(ours[doc] and not theirs[doc] for doc in shared)
    return {
        "prompts": len(shared),
        "lost": lost,
        "gained": gained,
        "p_value": drop_p_value(lost, gained),
    }


def mean_above_p_value(
    values: list[float], margin: float, draws: int = 20_000, seed: int = 0
) -> float:
    """One-sided paired sign-flip test that the mean of ``values`` (per
    document, candidate's loss against the reference) exceeds ``margin``:
    under the null each document's excess over the margin is as likely
    negative as positive. Exact up to 16 documents, else ``draws`` random
    flips (seeded, with the observed one counted)."""
    excess = [value - margin for value in values]
    if not excess:
        return 1.0
    observed = sum(excess)
    if len(excess) <= 16:
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


def smallest_flagged_drop(prompts: int, gained: int, lengths: int) -> float | None:
    """The smallest net drop, in points, this run could have flagged at one
    length: with the ``gained`` prompts it saw kept, the fewest losses whose
    p-value passes Holm's strictest step (``ALPHA / lengths``), less the
    gains. None where no number of losses could."""
    for lost in range(prompts - gained + 1):
        if drop_p_value(lost, gained) <= ALPHA / lengths:
            return 100.0 * (lost - gained) / prompts
    return None


def flags(lengths: dict[Any, tuple[dict[str, bool], dict[str, bool]]]) -> set[Any]:
    """The lengths at which ``ours`` is flagged: ``{length: (ours, theirs)}``."""
    tests = {n: paired(ours, theirs) for n, (ours, theirs) in lengths.items()}
    return holm({n: t["p_value"] for n, t in tests.items() if t is not None})


# -- simulation ---------------------------------------------------------------


def _pool_answers(
    draw: random.Random, truth: list[bool], redraw: float, accuracy: float
) -> list[bool]:
    """One pool's run: each prompt's answer, redrawn with chance ``redraw``
    (nondeterminism: batching, kernels' order of addition)."""
    return [
        (draw.random() < accuracy) if draw.random() < redraw else right
        for right in truth
    ]


def simulate_run(
    draw: random.Random,
    prompts: int,
    lengths: int,
    accuracy: float,
    redraw: float,
    drop: float,
    dropped_lengths: int,
    other_tests: int = 0,
) -> bool:
    """One comparison: whether the rule flags the candidate. It loses each
    prompt the reference's answer would get right with chance
    ``drop / accuracy`` at the ``dropped_lengths`` longest lengths; the
    family holds ``other_tests`` more with no effect (uniform p-values: the
    most false alarms a valid test can add)."""
    p_values: dict[Any, float] = {}
    for length in range(lengths):
        truth = [draw.random() < accuracy for _ in range(prompts)]
        reference = _pool_answers(draw, truth, redraw, accuracy)
        candidate = _pool_answers(draw, truth, redraw, accuracy)
        if length >= lengths - dropped_lengths:
            candidate = [
                right and draw.random() >= drop / accuracy for right in candidate
            ]
        lost = sum(r and not c for c, r in zip(candidate, reference, strict=True))
        gained = sum(c and not r for c, r in zip(candidate, reference, strict=True))
        p_values[length] = drop_p_value(lost, gained)
    for other in range(other_tests):
        p_values[f"other {other}"] = draw.random()
    return bool(holm(p_values))


def flag_rate(
    prompts: int,
    drop: float,
    runs: int = 400,
    lengths: int = DEFAULT_FAMILY["lengths"],
    accuracy: float = 0.9,
    redraw: float = 0.05,
    dropped_lengths: int = 2,
    other_tests: int = DEFAULT_FAMILY["other_tests"],
    seed: int = 0,
) -> float:
    """The share of ``runs`` simulated comparisons the rule flags, with
    ``prompts`` paired prompts per length."""
    draw = random.Random(seed)
    return (
        sum(
            simulate_run(
                draw,
                prompts,
                lengths,
                accuracy,
                redraw,
                drop,
                dropped_lengths,
                other_tests,
            )
            for _ in range(runs)
        )
        / runs
    )


SIMULATED_DROPS = (0.0, 0.02, 0.03, 0.05)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    sim = commands.add_parser("simulate", help="the rule's flag rates by simulation")
    sim.add_argument(
        "--docs", type=int, nargs="+", default=[10, 100, 200, 300],
        help="RULER prompts per task and length (RULER_EVAL_DOCS)",
    )  # fmt: skip
    sim.add_argument("--runs", type=int, default=400)
    args = parser.parse_args(argv)
    family = DEFAULT_FAMILY
    print(
        f"Flag rate of the paired rule (Holm at {ALPHA} over "
        f"{family['lengths'] + family['other_tests']} tests: RULER at "
        f"{family['lengths']} lengths, {family['tasks']} tasks pooled, and "
        f"{family['other_tests']} with no effect), by simulation: {args.runs} "
        "comparisons per cell, reference accuracy 0.9, each answer redrawn with "
        "chance 0.05 in each pool, the drop at the 2 longest lengths"
    )
    print()
    print(
        "| RULER_EVAL_DOCS (prompts per length) | no effect | 2-point drop "
        "| 3-point drop | 5-point drop |"
    )
    print("| --- | --- | --- | --- | --- |")
    for docs in args.docs:
        prompts = docs * family["tasks"]
        rates = [flag_rate(prompts, drop, args.runs) for drop in SIMULATED_DROPS]
        print(
            f"| {docs} ({prompts}) | "
            + " | ".join(f"{rate:.1%}" for rate in rates)
            + " |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
