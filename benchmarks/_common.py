"""Shared plumbing for the benchmarks: run a measurement in a child process.

vLLM resolves its platform (and loads plugins) once per process, so every
configuration compared here runs in its own child, on the simulated platform
from ``sim`` (the same stand-ins the tests use: they only make the
accelerator look present).
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from vllm_minimax_m3_kv.entrypoints.output import markdown_table as table
from vllm_minimax_m3_kv_sim.plumbing.children import json_from_out_file

__all__ = ["print_result", "run_child", "sweep_parser", "table"]

# Loading only another installed plugin keeps this one out, as a stock install.


def run_child(module: str, args: list[str], env: dict[str, str]) -> Any:
    """Run ``python -m MODULE --child ARGS --out FILE``; the JSON it wrote."""
    return json_from_out_file(["-m", module, "--child", *args], env)


def print_result(
    result: dict[str, Any],
    render: Callable[[dict[str, Any]], str],
    started: float,
    json_only: bool,
) -> None:
    """The rendered table (unless ``json_only``), then one JSON line: the
    result without its rows, with the run's wall time."""
    result["seconds"] = round(time.perf_counter() - started, 1)
    if not json_only:
        print(render(result))
        print()
    summary = {k: v for k, v in result.items() if k != "rows"}
    print(json.dumps(summary | {"cells": len(result.get("rows", []))}))


def sweep_parser(description: str, quick_help: str) -> argparse.ArgumentParser:
    """The arguments of a benchmark that sweeps cells over child processes:
    ``--quick``, ``--json``, ``--workers``, and the hidden ``--child`` /
    ``--out`` a parent hands each child (add the child's own inputs)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--quick", action="store_true", help=quick_help)
    parser.add_argument("--json", action="store_true", help="print JSON only")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    return parser


def sweep_main(
    options: argparse.Namespace,
    child: Callable[[], Any],
    measure: Callable[[str, int], dict[str, Any]],
    render: Callable[[dict[str, Any]], str],
) -> None:
    """As a child, write ``child()``'s JSON to ``--out``; as the parent, run
    the sweep at its size and print it (:func:`print_result`)."""
    if options.child:
        Path(options.out).write_text(json.dumps(child()))
        return
    start = time.perf_counter()
    result = measure("quick" if options.quick else "full", options.workers)
    print_result(result, render, start, options.json)
