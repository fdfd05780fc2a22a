"""The upstream patches' equivalence with the plugin, as tables.

``python -m tests.upstream.report [--size quick|full]`` applies PR 1, and PR 1
+ PR 3, to overlays of the installed vLLM, runs the equivalence cells on each
without the plugin (``PLATFORMS_BY_SERIES``), runs the reliability matrix with
the plugin on stock vLLM, and counts per platform how the cells compare; the
tables in ``docs/upstream.md`` are its output.
"""

from __future__ import annotations

import argparse
import collections
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from tests.reliability.matrix import PLATFORMS, SIZES, hardware_groups
from tests.reliability.report import run_matrix
from tests.upstream import equivalence, overlay
from vllm_minimax_m3_kv_sim.plumbing.children import json_from_out_file

# Platforms per series and matrix size (one process per simulated GPU). Full:
# PR 1 everywhere. Quick: the recipes' GPUs (MI355X with AITER sparse PA, SM100),
# MI355X without it (today's public recipe) and SM90, where PR 1's default
# does not apply.
PLATFORMS_BY_SERIES = {
    "pr1": {
        "full": tuple(PLATFORMS),
        "quick": ("mi355x-aiter-spa", "mi355x", "sm100", "sm90"),
    },
    # Every platform with checkpoint-KV cells (matrix.CHECKPOINT_KV_PLATFORMS).
    "pr1_pr3": {
        "full": ("mi355x-aiter-spa", "mi355x", "mi300x", "sm100"),
        "quick": ("mi355x-aiter-spa", "sm100"),
    },
    "with_plugin": {
        "full": ("mi355x-aiter-spa", "sm100"),
        "quick": ("mi355x-aiter-spa",),
    },
}


def run_patched(
    patched: overlay.Overlay,
    platforms: tuple[str, ...] = tuple(PLATFORMS),
    with_plugin: bool = False,
    size: str = "full",
    workers: int = 2,
    series: str = "pr1",
) -> dict[str, dict]:
    """Per platform, the equivalence cells on the patched vLLM: without the
    plugin, or with every installed plugin (the patch and the plugin both).
    One process per simulated GPU."""
    env = overlay.child_env(patched)
    if with_plugin:
        del env["VLLM_PLUGINS"]

    def run(group: list[str]) -> dict[str, dict]:
        argv = ["-m", "tests.upstream.equivalence", "--size", size]
        argv += ["--series", series]
        for platform in group:
            argv += ["--platform", platform]
        return json_from_out_file(argv, env, timeout=3600)

    runs: dict[str, dict] = {}
    with ThreadPoolExecutor(workers) as pool:
        for result in pool.map(run, hardware_groups(platforms)):
            runs.update(result)
    return {platform: runs[platform] for platform in platforms}


def render(comparisons: dict[str, equivalence.Comparison], series: str) -> str:
    same = ("same uniform", "same config_error")
    declared = [
        d.name for d in equivalence.DECLARED_DIFFERENCES if series in d.upstream
    ]
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
        runs = {
            "pr1": run_patched(
                overlay.build(Path(workdir) / "pr1", overlay.PR1),
                PLATFORMS_BY_SERIES["pr1"][options.size],
                size=options.size,
                workers=options.workers,
            ),
            "pr1_pr3": run_patched(
                overlay.build(Path(workdir) / "pr1_pr3", overlay.PR1_PR3),
                PLATFORMS_BY_SERIES["pr1_pr3"][options.size],
                size=options.size,
                workers=options.workers,
                series="pr1_pr3",
            ),
        }
    plugin = run_matrix(options.size, options.workers)
    for series, title in (("pr1", "PR 1 alone"), ("pr1_pr3", "PR 1 + PR 3")):
        comparisons = {
            platform: equivalence.compare(
                platform, plugin[platform]["plugin"], run, series, options.size
            )
            for platform, run in runs[series].items()
        }
        print(f"{title} ({options.size}):\n")
        print(render(comparisons, series))
        print()
        pairs = collections.Counter(
            (platform, ours, theirs)
            for platform, comparison in comparisons.items()
            for _, ours, theirs, _ in comparison.unexplained
        )
        for (platform, ours, theirs), count in sorted(pairs.items()):
            print(f"unexplained: {platform}: plugin {ours}, {title} {theirs}: {count}")
        for comparison in comparisons.values():
            for cell in comparison.unexplained[:2]:
                print("  e.g.", *cell)


if __name__ == "__main__":
    sys.exit(main())
