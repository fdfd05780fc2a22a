"""``vllm-minimax-m3-kv check``: will this MiniMax-M3 config start with one
KV precision?

Takes the flags ``vllm serve`` takes (parsed by vLLM's own parser) plus
``--target``, and answers on a machine without that GPU: vLLM's own config
validation runs with the plugin's hook judging for the target, so the live
hook and this command reach their verdict from the same function.

Everything this command can refuse on its own (``--help``, its own flags, a
model path that does not exist, a missing or unsupported vLLM) is answered
before vLLM is imported, in well under a second; a full verdict pays for
importing vLLM (10-20 s), because it is vLLM's own validation.

stdout is the plan; every refusal, with its fixes, and every warning go to
stderr. Exit 0: starts with one precision. 3: starts with a mixed pool the
operator opted into. 2: refused at startup. 1: this command's usage errors.
"""

from __future__ import annotations

import sys
from dataclasses import asdict
from pathlib import Path

from vllm_minimax_m3_kv.config.verdicts import Outcome
from vllm_minimax_m3_kv.entrypoints.check.arguments import (
    EXIT_USAGE,
    PROG,
    CheckUsageError,
)
from vllm_minimax_m3_kv.entrypoints.check.batch import check_commands
from vllm_minimax_m3_kv.entrypoints.check.early import judge_without_vllm
from vllm_minimax_m3_kv.entrypoints.check.run import (
    CheckResult,
    prepare_process,
    run_check,
)
from vllm_minimax_m3_kv.entrypoints.output import Mode, Output
from vllm_minimax_m3_kv.verdict_text import refusal_text


def main(argv: list[str] | None = None) -> int:
    """``check``'s command line (the words after ``check``); its exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    prepare_process(argv)
    try:
        early = judge_without_vllm(argv)
    except CheckUsageError as error:
        Output().problem(f"{PROG}: {error}")
        return EXIT_USAGE
    out = Output(Mode.of(as_json=early.as_json, quiet=early.quiet))
    if early.commands is not None:
        assert early.target is not None
        return check_commands(Path(early.commands), early.target, out)
    result = run_check(argv, early=early)
    if result.plan is None:
        out.text(result.text)  # --help, --version
    else:
        out.answer(result.plan.render(), asdict(result.plan))
    out.problem(stderr_text(result))
    return result.exit


def stderr_text(result: CheckResult) -> str:
    """What check prints on stderr: a usage error, or a refusal and its
    fixed commands, or a mixed pool's warning; then the verdict's notes."""
    if result.usage_error:
        return f"{PROG}: {result.usage_error}\n"
    plan = result.plan
    if plan is None:
        return ""
    lines = []
    if plan.outcome is Outcome.ERROR:
        commands = [fix["command"] for fix in plan.fixes if "command" in fix]
        lines.append(refusal_text(plan.message, commands))
    elif plan.outcome is Outcome.MIXED:
        lines.append(f"warning: {plan.message}")
    lines += [f"warning: {note}" for note in plan.notes]
    return "".join(line + "\n" for line in lines)
