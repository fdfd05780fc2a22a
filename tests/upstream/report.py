"""The upstream patch's equivalence with the plugin, as a table.

``python -m tests.upstream.report`` applies the patch to an overlay of the
installed vLLM, runs the equivalence cells on it without the plugin, runs the
reliability matrix with the plugin on stock vLLM, and counts per platform how
the cells compare; the README's "Upstream" table is its output.
"""

from __future__ import annotations

import argparse
import collections
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from sim.process import json_from_out_file
from tests.reliability.matrix import PLATFORMS, SIZES, hardware_groups
from tests.reliability.report import run_matrix
from tests.upstream import equivalence, overlay


def run_patched(
    patched: overlay.Overlay,
    platforms: tuple[str, ...] = tuple(PLATFORMS),
    with_plugin: bool = False,
    size: str = "full",
    workers: int = 2,
) -> dict[str, dict]:
    """Per platform, the equivalence cells on the patched vLLM: without the
    plugin, or with every installed plugin (the patch and the plugin both).
    One process per simulated GPU."""
    env = overlay.child_env(patched)
    if with_plugin:
        del env["VLLM_PLUGINS"]

    def run(group: list[str]) -> dict[str, dict]:
        argv = ["-m", "tests.upstream.equivalence", "--size", size]
        for platform in group:
            argv += ["--platform", platform]
        return json_from_out_file(argv, env, timeout=3600)

    runs: dict[str, dict] = {}
    with ThreadPoolExecutor(workers) as pool:
        for result in pool.map(run, hardware_groups(platforms)):
            runs.update(result)
    return {platform: runs[platform] for platform in platforms}


def render(comparisons: dict[str, equivalence.Comparison]) -> str:
    same = ("same uniform", "same config_error")
    declared = [d.name for d in equivalence.DECLARED_DIFFERENCES]
    headers = ["platform", "cells", *same, "same, other", *declared, "unexplained"]
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    total: collections.Counter[str] = collections.Counter()
    rows = []
    for platform, comparison in comparisons.items():
        tally = comparison.tally
        row = collections.Counter(
            {
                "cells": sum(tally.values()) + len(comparison.unexplained),
                **{key: tally[key] for key in (*same, *declared)},
                "same, other": sum(n for k, n in tally.items() if k.startswith("same "))
                - sum(tally[key] for key in same),
                "unexplained": len(comparison.unexplained),
            }
        )
        total.update(row)
        rows.append((platform, row))
    for platform, row in [*rows, ("total", total)]:
        cells = [f"{row[key]:,}" for key in headers[1:]]
        lines.append("| " + " | ".join([platform, *cells]) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", choices=SIZES, default="full")
    parser.add_argument("--workers", type=int, default=2)
    options = parser.parse_args()
    with tempfile.TemporaryDirectory() as workdir:
        patched = overlay.build(Path(workdir))
        runs = run_patched(patched, size=options.size, workers=options.workers)
    plugin = run_matrix(options.size, options.workers)
    comparisons = {
        platform: equivalence.compare(
            platform, plugin[platform]["plugin"], run, options.size
        )
        for platform, run in runs.items()
    }
    print(render(comparisons))
    for comparison in comparisons.values():
        for cell in comparison.unexplained[:5]:
            print("unexplained:", *cell, sep="\n  ")


if __name__ == "__main__":
    sys.exit(main())
