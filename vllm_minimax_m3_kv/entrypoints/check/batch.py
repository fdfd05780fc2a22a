"""``check --commands FILE``: judge every ``vllm serve`` command in a file.

The file is read as bash runs it (:mod:`.script`): continuations, comments,
``export``/``unset`` lines and command prefixes give each serve command its
environment. Each serve command is judged by ``check`` itself; one that
cannot be read or judged is reported on its own row with its line number,
never as a traceback, and never outranks a verdict; a command that is not
``vllm serve`` is listed as skipped and counts for nothing. The exit code is
the worst verdict among the judged commands (refused 2, mixed 3, else 0), or
:data:`EXIT_UNJUDGED` when every judged command starts uniform but some serve
line could not be judged.
"""

from __future__ import annotations

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
from vllm_minimax_m3_kv.entrypoints.check.script import (
    CommandLine,
    NotServe,
    Serve,
    read_script,
)
from vllm_minimax_m3_kv.entrypoints.output import Output

_SEVERITY = {EXIT_OK: 0, EXIT_MIXED: 1, EXIT_REFUSED: 2}
SKIPPED = "skipped"


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
    env: dict[str, str | None] = field(default_factory=dict)
    """What the file set (or unset: None) for this command, over check's
    own environment."""

    @property
    def judged(self) -> bool:
        return self.exit in _SEVERITY


def judge_line(command: CommandLine, entry: Serve | NotServe, target: str) -> Row:
    """One command's row, whatever happens."""
    if isinstance(entry, NotServe):
        outcome = "not judged" if entry.may_be_serve else SKIPPED
        return Row(command.number, None, outcome, why=entry.why)
    result = run_check([*entry.argv, "--target", target], env=entry.env)
    plan = result.plan
    if plan is None or result.exit not in _SEVERITY:
        why = result.usage_error or "no plan"
        return Row(command.number, result.exit, "not judged", why=why, env=entry.env)
    why = plan.headline if result.exit != EXIT_OK else ""
    if entry.unexported:
        # bash keeps a plain VAR=value line from the commands it runs.
        names = ", ".join(entry.unexported)
        why = "; ".join(filter(None, [why, f"set but not exported: {names}"]))
    return Row(
        command.number,
        result.exit,
        plan.outcome,
        plan.kv_cache_dtype,
        plan.indexer_kv_dtype,
        why=why,
        fixes=[fix.get("command", fix["line"]) for fix in plan.fixes],
        env=entry.env,
    )


def exit_code(rows: list[Row]) -> int:
    """The worst verdict among judged rows; EXIT_UNJUDGED where that is a
    start and some serve line was not judged. Skipped lines count for
    nothing."""
    judged = [row.exit for row in rows if row.judged]
    worst = max(judged, key=_SEVERITY.__getitem__, default=EXIT_OK)
    unjudged = (not row.judged and row.outcome != SKIPPED for row in rows)
    if worst == EXIT_OK and any(unjudged):
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
    entries = read_script(path.read_text(encoding="utf-8", errors="replace"))
    if not any(isinstance(entry, Serve) for _, entry in entries):
        out.problem(f"{PROG}: --commands {path}: no vllm serve command in the file")
        return EXIT_USAGE
    rows = [judge_line(command, entry, target) for command, entry in entries]
    code = exit_code(rows)
    out.answer(render(rows), {"exit": code, "rows": [asdict(row) for row in rows]})
    return code
