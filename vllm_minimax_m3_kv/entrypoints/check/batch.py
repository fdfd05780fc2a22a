"""``check --commands FILE``: judge every ``vllm serve`` command in a file.

A file is read as a shell would read a script of commands: a line ending in a
backslash continues on the next, blank lines and ``#`` comments are skipped,
leading ``VAR=value`` words are the command's environment. Each command is
judged by ``check`` itself; one that cannot be read or judged is reported on
its own row with its line number, never as a traceback, and never outranks a
verdict: the exit code is the worst verdict among the judged commands
(refused 2, mixed 3, else 0), or :data:`EXIT_UNJUDGED` when every judged
command starts uniform but some line could not be judged.
"""

from __future__ import annotations

import shlex
from dataclasses import asdict, dataclass, field
from pathlib import Path

from vllm_minimax_m3_kv.entrypoints.check.arguments import (
    EXIT_MIXED,
    EXIT_OK,
    EXIT_REFUSED,
    EXIT_UNJUDGED,
    EXIT_USAGE,
    PROG,
)
from vllm_minimax_m3_kv.entrypoints.check.run import run_check
from vllm_minimax_m3_kv.entrypoints.output import Output

_SEVERITY = {EXIT_OK: 0, EXIT_MIXED: 1, EXIT_REFUSED: 2}


@dataclass(frozen=True)
class CommandLine:
    """One logical command of the file."""

    number: int
    """Its first physical line, as an editor numbers it."""
    text: str
    """Backslash continuations joined, as the shell joins them."""


def command_lines(text: str) -> list[CommandLine]:
    """The file's commands: continuations joined; blank and comment lines out."""
    commands: list[CommandLine] = []
    pending: list[str] = []
    start = 0
    for number, line in enumerate(text.splitlines(), 1):
        if not pending:
            if not line.strip() or line.lstrip().startswith("#"):
                continue
            start = number
        # An odd run of trailing backslashes escapes the newline.
        trailing = len(line) - len(line.rstrip("\\"))
        if trailing % 2:
            pending.append(line[:-1])
            continue
        pending.append(line)
        commands.append(CommandLine(start, "".join(pending)))
        pending = []
    if pending:  # the file ends inside a continuation: judge what is there
        commands.append(CommandLine(start, "".join(pending)))
    return commands


def split_command(line: str) -> tuple[dict[str, str], list[str]]:
    """A command as its environment and check's argv (``vllm serve`` dropped);
    ValueError when the shell could not split it either."""
    words = shlex.split(line, comments=True)
    env: dict[str, str] = {}
    while words and "=" in words[0] and not words[0].startswith("-"):
        name, value = words.pop(0).split("=", 1)
        env[name] = value
    if words[:2] == ["vllm", "serve"]:
        words = words[2:]
    return env, words


@dataclass
class Row:
    line: int
    exit: int | None
    """check's exit code; None where the line was not judged."""
    outcome: str
    kv_cache_dtype: str = ""
    indexer_kv_dtype: str = ""
    why: str = ""
    fixes: list[str] = field(default_factory=list)
    """Each fix applied to the command, as it runs (refusals only)."""

    @property
    def judged(self) -> bool:
        return self.exit in _SEVERITY


def judge_line(command: CommandLine, target: str) -> Row:
    """One command's row, whatever happens."""
    try:
        env, words = split_command(command.text)
    except ValueError as error:
        return Row(command.number, None, "not judged", why=f"unreadable: {error}")
    result = run_check([*words, "--target", target], env=env)
    plan = result.plan
    if plan is None or result.exit not in _SEVERITY:
        why = result.usage_error or "no plan"
        return Row(command.number, result.exit, "not judged", why=why)
    return Row(
        command.number,
        result.exit,
        plan.outcome,
        plan.kv_cache_dtype,
        plan.indexer_kv_dtype,
        why=plan.headline if result.exit != EXIT_OK else "",
        fixes=[fix.get("command", fix["line"]) for fix in plan.fixes],
    )


def exit_code(rows: list[Row]) -> int:
    """The worst verdict among judged rows; EXIT_UNJUDGED where that is a
    start and some line was not judged."""
    judged = [row.exit for row in rows if row.judged]
    worst = max(judged, key=_SEVERITY.__getitem__, default=EXIT_OK)
    if worst == EXIT_OK and any(not row.judged for row in rows):
        return EXIT_UNJUDGED
    return worst


def render(rows: list[Row]) -> str:
    table = [
        "| line | exit | outcome | main KV | indexer | why (refused, mixed or not judged) |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for row in rows:
        cells = (
            row.line,
            "-" if row.exit is None else row.exit,
            row.outcome,
            row.kv_cache_dtype,
            row.indexer_kv_dtype,
            row.why.replace("|", "\\|"),
        )
        table.append("| " + " | ".join(str(cell) for cell in cells) + " |")
    for row in rows:
        if row.fixes:
            table += ["", f"line {row.line}: fix with one of:"]
            table += [f"  {fix}" for fix in row.fixes]
    return "\n".join(table)


def check_commands(path: Path, target: str, out: Output) -> int:
    """Judge every command of ``path`` for ``target``; print the rows."""
    commands = command_lines(path.read_text(encoding="utf-8", errors="replace"))
    if not commands:
        out.problem(f"{PROG}: --commands {path}: no command in the file")
        return EXIT_USAGE
    rows = [judge_line(command, target) for command in commands]
    code = exit_code(rows)
    out.answer(render(rows), {"exit": code, "rows": [asdict(row) for row in rows]})
    return code
