"""Where every command's output goes: one sink, three modes.

stdout carries a command's answer: text for a person, one JSON object with
``--json``, nothing with ``--quiet`` (the exit code is the answer). stderr
carries usage errors, refusals and warnings in every mode, so a script that
reads the JSON or only the exit code still shows why. No other module of the
package prints.
"""

from __future__ import annotations

import argparse
import enum
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


class Mode(enum.Enum):
    HUMAN = "human"
    JSON = "json"
    QUIET = "quiet"

    @classmethod
    def of(cls, *, as_json: bool = False, quiet: bool = False) -> Mode:
        return cls.JSON if as_json else cls.QUIET if quiet else cls.HUMAN


def add_output_flags(parser: argparse.ArgumentParser) -> None:
    """``--json`` and ``--quiet``, for a command whose parser is its own
    (``check`` adds the same two among vLLM's serve flags)."""
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--json", action="store_true", help="Print one JSON object.")
    mode.add_argument(
        "--quiet", action="store_true", help="Print nothing; the exit code says."
    )


def markdown_table(headers: list[str], rows: list[list[Any]]) -> str:
    """A Markdown table, so the docs can carry a command's output verbatim."""
    cells = [[str(cell) for cell in row] for row in [headers, *rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]

    def line(row: list[str]) -> str:
        padded = (c.ljust(w) for c, w in zip(row, widths, strict=True))
        return "| " + " | ".join(padded) + " |"

    rule = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    return "\n".join([line(cells[0]), rule, *map(line, cells[1:])])


def aligned(rows: Sequence[tuple[str, str]]) -> str:
    """Name/value rows, the values in one column (``check``'s plan, ``status``)."""
    width = max((len(name) for name, _ in rows), default=0)
    return "\n".join(f"{name:<{width}}  {value}" for name, value in rows)


@dataclass(frozen=True)
class Output:
    mode: Mode = Mode.HUMAN

    @classmethod
    def asked_by(cls, args: argparse.Namespace) -> Output:
        """The sink the flags of :func:`add_output_flags` ask for."""
        return cls(Mode.of(as_json=args.json, quiet=args.quiet))

    def answer(self, human: str, data: Any) -> None:
        """The command's answer: ``human`` as text, or ``data`` as JSON."""
        if self.mode is Mode.QUIET:
            return
        _write(
            sys.stdout, json.dumps(data, indent=2) if self.mode is Mode.JSON else human
        )

    def text(self, human: str) -> None:
        """Text asked for by name (``--help``, ``--version``): in every mode."""
        _write(sys.stdout, human)

    def problem(self, text: str) -> None:
        """A usage error, refusal or warning: stderr, in every mode."""
        _write(sys.stderr, text)


def _write(stream: Any, text: str) -> None:
    if text:
        stream.write(text if text.endswith("\n") else text + "\n")
