"""How a user reads a rendered fix line: the reliability matrix's own reader.

The product only renders fixes (``Fix.render``); this reads a line back as a
user would paste it (variables and flags before ``#``, what no flag sets in
the comment), independently of the product, so that a fix whose text and
edits disagree shows up as a matrix cell that does not start.
"""

from __future__ import annotations

import shlex

from vllm_minimax_m3_kv.config.verdicts import Fix

NOTE_SEPARATOR = "; "
REMOVES = "remove "
REMOVES_END = " from the command"
NEEDS = "needs "


def read_fix_line(line: str) -> Fix:
    """The fix a rendered line states (a summary holding ``"; "`` does not
    read back whole)."""
    command, _, comment = f" {line.strip()}".partition(" # ")
    summary, *notes = comment.split(NOTE_SEPARATOR)
    words = iter(shlex.split(command))
    env: list[tuple[str, str]] = []
    flags: list[tuple[str, str]] = []
    for word in words:
        if word.startswith("--"):
            flags.append((word, next(words)))
        else:
            name, _, value = word.partition("=")
            env.append((name, value))
    return Fix(
        summary,
        flags=tuple(flags),
        env=tuple(env),
        requires=tuple(n.removeprefix(NEEDS) for n in notes if n.startswith(NEEDS)),
        without=tuple(
            n.removeprefix(REMOVES).removesuffix(REMOVES_END)
            for n in notes
            if n.startswith(REMOVES)
        ),
    )
