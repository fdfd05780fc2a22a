"""``run_check()``: one ``check`` of one command, as a result object.

The command line (:mod:`.main`), ``--commands`` (:mod:`.batch`) and the
simulation harness all judge through it; none of them reads a verdict back
out of printed text.
"""

from __future__ import annotations

import argparse
import contextlib
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace

from vllm_minimax_m3_kv.config.targets import HERE
from vllm_minimax_m3_kv.entrypoints.check.arguments import (
    EXIT_OK,
    EXIT_USAGE,
    VERBOSE_FLAG,
    CheckUsageError,
    build_parser,
    own_parser,
    vllm_help,
)
from vllm_minimax_m3_kv.entrypoints.check.early import (
    BUNDLED_HUB_ID,
    EarlyAnswer,
    judge_without_vllm,
    judges_this_machine,
    model_argument,
    versions_line,
    without_model,
)
from vllm_minimax_m3_kv.entrypoints.check.judge import (
    plan_for,
    quiet_stderr,
    require_a_gpu_here,
)
from vllm_minimax_m3_kv.entrypoints.check.plan import Plan
from vllm_minimax_m3_kv.entrypoints.serve_flags import known_group_help
from vllm_minimax_m3_kv.verdict_text import (
    arity_of,
    command_env,
    fixed_command,
)


@dataclass(frozen=True)
class CheckResult:
    """What one ``check`` answered: a plan (its exit code is the verdict's),
    a usage error (exit 1, one line), or text (``--help``, ``--version``)."""

    exit: int
    plan: Plan | None = None
    usage_error: str = ""
    text: str = ""


def prepare_process(argv: list[str]) -> None:
    """The environment a preflight runs in, set before vLLM is imported."""
    # A named target's verdict is never for this machine: vLLM's CPU platform
    # lets its serve parser build anywhere, GPU or not, and the same way.
    # --target here is judged on the platform vLLM detects.
    if not judges_this_machine(argv):
        os.environ["VLLM_TARGET_DEVICE"] = "cpu"
    # A preflight reads configs it has; a hub id it lacks fails at once
    # rather than retrying for minutes on a machine without network.
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    # stdout is the plan (or its JSON); vLLM's own logs, shown with
    # --verbose, go to stderr.
    os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")


@contextlib.contextmanager
def _environment(env: Mapping[str, str | None] | None) -> Iterator[None]:
    """``env`` over this process's environment (None: unset), for one
    command's check."""
    if not env:
        yield
        return
    saved = dict(os.environ)
    for name, value in env.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def run_check(
    argv: list[str],
    env: Mapping[str, str | None] | None = None,
    early: EarlyAnswer | None = None,
) -> CheckResult:
    """Judge one ``check`` command line (``vllm serve`` flags plus check's)
    with ``env`` (``VLLM_ROCM_*`` and the like) over this process's.
    ``early``: what :func:`judge_without_vllm` already answered for ``argv``
    in a prepared process (the command line asks it first)."""
    argv = list(argv)
    if early is None:
        prepare_process(argv)
    with _environment(env):
        try:
            return _run(argv, early or judge_without_vllm(argv))
        except CheckUsageError as error:
            return CheckResult(EXIT_USAGE, usage_error=str(error))


def _run(argv: list[str], early: EarlyAnswer) -> CheckResult:
    if early.version:
        return CheckResult(EXIT_OK, text=versions_line() + "\n")
    if early.help is True:
        return CheckResult(EXIT_OK, text=own_parser().format_help())
    if early.commands is not None:
        raise CheckUsageError("--commands judges a file from the command line only")
    if early.help is not False and (shipped := known_group_help(str(early.help))):
        # A flag group of the installed vLLM: its help, shipped, no vLLM import.
        return CheckResult(EXIT_OK, text=shipped)
    with quiet_stderr(VERBOSE_FLAG not in argv):
        if early.target == HERE:
            # Before vLLM's parser, which cannot be built without a device.
            require_a_gpu_here()
        parser = build_parser()
        if early.help is not False:
            return CheckResult(EXIT_OK, text=vllm_help(parser, str(early.help)))
        if early.bundled_for is not None:
            argv = without_model(argv, early.bundled_for)
        plan = plan_for(parser.parse_args(argv), argv)
        plan = with_fixed_commands(plan, argv, parser)
    if early.bundled_for is not None:
        plan = replace(
            plan,
            model_note=f"{early.bundled_for} is not in the local cache: the "
            "bundled config of that checkpoint is judged (its architecture "
            "values, no weights)",
        )
    return CheckResult(plan.exit_code, plan=plan)


def with_fixed_commands(
    plan: Plan, argv: list[str], parser: argparse.ArgumentParser
) -> Plan:
    """``plan`` with each fix's ``command``: the user's own ``vllm serve``
    command (check's flags left out) with that fix applied."""
    if not plan.fixes:
        return plan
    _, serve_words = own_parser().parse_known_args(argv)
    if model_argument(serve_words) is None:
        # The bundled config stands for the published checkpoint.
        serve_words = [BUNDLED_HUB_ID, *serve_words]
    env, arity = command_env(), arity_of(parser)
    return replace(
        plan,
        fixes=[
            {**fix, "command": fixed_command(serve_words, env, fix, arity)}
            for fix in plan.fixes
        ],
    )
