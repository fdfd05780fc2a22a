#!/usr/bin/env python3
"""RULER for the MiniMax-M3 launch scripts (standard library only): the
tasks where an indexer fails first, through lm-eval's own ``ruler`` tasks.

Multi-key needle-in-a-haystack (``niah_multikey_2``: many needles with
near-duplicate keys in a haystack of needles; ``niah_multikey_3``: UUID
keys) asks the indexer to tell apart blocks that look alike; variable
tracking (``ruler_vt``) asks it to follow a chain of assignments spread
through noise. lm-eval builds every prompt itself, sized by the served
checkpoint's own tokenizer (``--metadata tokenizer=...``), with no hub
download: these three read neither the essay haystack nor nltk's data.

RULER scores each length under its own name (``"4096"``...), and lm-eval
reports only the standard ones, so only those are run: each that fits
``MAX_MODEL_LEN`` with the room lm-eval's answer prefix and its longest
answer (``max_gen_toks``, 128) need.

``lengths``: the standard lengths that fit, or exit 2 with why none does.

``scores`` (for the compare report): per task and length, accuracy and each
prompt's outcome (its RULER score is 1.0: every expected answer given) from
lm-eval's samples files.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

STANDARD_LENGTHS = (4_096, 8_192, 16_384, 32_768, 65_536, 131_072)
DEFAULT_TASKS = ("niah_multikey_2", "niah_multikey_3", "ruler_vt")
ANSWER_ROOM = 96
"""Tokens past the length a RULER request needs: lm-eval sizes each prompt
so that it and ``max_gen_toks`` (128 for the needle tasks, 30 for vt) fit
the length, then appends its answer prefix ("The special magic number for
KEY mentioned in the provided text is", up to about 40 tokens with a UUID
key) to the request."""
EVAL_DIR = "eval_ruler"


def lengths_that_fit(lengths: list[int], max_model_len: int) -> list[int]:
    return sorted(
        n
        for n in set(lengths)
        if n in STANDARD_LENGTHS and n + ANSWER_ROOM <= max_model_len
    )


def outcomes(samples: Path) -> dict[str, bool]:
    """Each prompt's outcome, by lm-eval's ``doc_id``, from one samples file:
    right when RULER's score for it is 1.0 (its scorer writes the score under
    the prompt's length's name and -1 under every other length's)."""
    found = {}
    with samples.open(encoding="utf-8") as lines:
        for line in lines:
            sample = json.loads(line)
            scores = [
                float(value)
                for key, value in sample.items()
                if key.isdigit() and isinstance(value, (int, float)) and value != -1
            ]
            if scores:
                found[str(sample["doc_id"])] = scores[0] == 1.0
    return found


def scores(eval_dir: Path) -> dict[str, dict[str, dict[str, Any]]]:
    """``{task: {length: {"accuracy", "docs", "outcomes"}}}`` from
    ``eval_dir/<length>/**/samples_<task>_*.jsonl`` (the newest of each)."""
    found: dict[str, dict[str, dict[str, Any]]] = {}
    for length_dir in sorted(eval_dir.glob("*"), key=lambda p: p.name):
        if not length_dir.name.isdigit():
            continue
        newest: dict[str, Path] = {}
        for path in sorted(
            length_dir.glob("**/samples_*.jsonl"), key=lambda p: p.stat().st_mtime
        ):
            task = path.name.removeprefix("samples_").rsplit("_", 1)[0]
            newest[task] = path
        for task, path in sorted(newest.items()):
            right = outcomes(path)
            if right:
                found.setdefault(task, {})[length_dir.name] = {
                    "accuracy": sum(right.values()) / len(right),
                    "docs": len(right),
                    "outcomes": right,
                }
    return found


def seconds(eval_dir: Path) -> float | None:
    """lm-eval's own wall time over every length (one run each), from the
    newest ``results_*.json`` under each length's folder."""
    spent = []
    for length_dir in eval_dir.glob("*"):
        found = sorted(
            length_dir.glob("**/results_*.json"), key=lambda p: p.stat().st_mtime
        )
        try:
            spent.append(
                float(
                    json.loads(found[-1].read_text())["total_evaluation_time_seconds"]
                )
            )
        except (IndexError, OSError, KeyError, TypeError, ValueError):
            continue
    return sum(spent) if spent else None


def _lengths(text: str) -> list[int]:
    return [int(word) for word in text.replace(",", " ").split()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    sub = commands.add_parser("lengths")
    sub.add_argument("--lengths", type=_lengths, required=True)
    sub.add_argument("--max-model-len", type=int, required=True)
    options = parser.parse_args(argv)
    fit = lengths_that_fit(options.lengths, options.max_model_len)
    if not fit:
        standard = [n for n in options.lengths if n in STANDARD_LENGTHS]
        print(
            "RULER: none of its standard lengths "
            f"({', '.join(str(n) for n in STANDARD_LENGTHS)}) is both in "
            f"LONG_EVAL_LENGTHS ({' '.join(map(str, options.lengths))}) and fits "
            f"MAX_MODEL_LEN={options.max_model_len} with {ANSWER_ROOM} tokens to "
            f"answer; set MAX_MODEL_LEN={min(standard or STANDARD_LENGTHS) + ANSWER_ROOM} "
            "or more",
            file=sys.stderr,
        )
        return 2
    print(" ".join(str(n) for n in fit))
    return 0


if __name__ == "__main__":
    sys.exit(main())
