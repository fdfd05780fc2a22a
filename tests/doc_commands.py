"""Parse the commands the docs show with the parsers that will read them.

``python -m tests.doc_commands CASES.json`` prints one JSON list of problems
(empty when every command parses). Cases (from ``tests/test_docs.py``):
``["check", ARGS...]`` through check's own front and vLLM's serve parser;
``["serve", ARGS...]`` through vLLM's serve parser; ``["module", NAME,
ARGS...]``, ``["script", PATH, ARGS...]`` (bash) and ``["pyscript", PATH,
ARGS...]`` (Python): every ``--flag`` used must be in that program's
``--help`` (a Python script's subcommand's, where it names one).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import runpy
import subprocess
import sys
from pathlib import Path


def _flags(args: list[str]) -> list[str]:
    return [a.split("=", 1)[0] for a in args if a.startswith("--")]


def _help_of_module(module: str) -> str:
    out = io.StringIO()
    saved = sys.argv
    sys.argv = [module, "--help"]
    try:
        with contextlib.redirect_stdout(out), contextlib.suppress(SystemExit):
            runpy.run_module(module, run_name="__main__", alter_sys=True)
    finally:
        sys.argv = saved
    return out.getvalue()


def check_one(case: list[str]) -> str | None:
    kind, *args = case
    if kind == "check":
        from vllm_minimax_m3_kv.entrypoints.check.arguments import (
            CheckUsageError,
            build_parser,
        )
        from vllm_minimax_m3_kv.entrypoints.check.early import judge_without_vllm

        try:
            judge_without_vllm(args)
            build_parser().parse_args(args)
        except CheckUsageError as error:
            return f"check {args}: {error}"
        return None
    if kind == "bench":
        from vllm_minimax_m3_kv.entrypoints.bench import build_parser as bench_parser

        try:
            options = bench_parser().parse_args(args)
        except SystemExit:
            return f"bench {args}: rejected by bench's parser"
        if options.render is not None and not options.render.is_file():
            return f"bench {args}: no file {options.render}"
        return None
    if kind == "serve":
        from vllm.entrypoints.common.cli_args import make_arg_parser
        from vllm.utils.argparse_utils import FlexibleArgumentParser

        try:
            make_arg_parser(FlexibleArgumentParser()).parse_args(args)
        except SystemExit:
            return f"vllm serve {args}: rejected by vLLM's serve parser"
        return None
    program, *args = args
    if kind == "module":
        text = _help_of_module(program)
    elif kind == "pyscript":
        subcommand = [a for a in args[:1] if not a.startswith("-")]
        proc = subprocess.run(
            [sys.executable, program, *subcommand, "--help"],
            capture_output=True,
            text=True,
        )
        if proc.returncode != 0:
            return f"{program} {subcommand}: --help failed: {proc.stderr[-300:]}"
        text = proc.stdout
    else:
        text = subprocess.run(
            ["bash", program, "--help"], capture_output=True, text=True
        ).stdout
    missing = [flag for flag in _flags(args) if flag not in text]
    return f"{program}: {missing} not in its --help" if missing else None


def main() -> None:
    os.environ["VLLM_TARGET_DEVICE"] = "cpu"
    cases = json.loads(Path(sys.argv[1]).read_text())
    problems = [problem for case in cases if (problem := check_one(case))]
    print(json.dumps(problems))


if __name__ == "__main__":
    main()
