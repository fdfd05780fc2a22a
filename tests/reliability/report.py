"""Run the whole reliability matrix and count its outcomes.

``python -m tests.reliability.report [--json]`` runs every platform's cells
with the plugin, and the cells it must leave as stock again without it, two child processes
at a time; the README's "Reliability" table is its output.
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from tests.reliability.matrix import PARTIAL_INSTALL_PLATFORMS, PLATFORMS
from tests.sim.process import json_from_out_file

WITHOUT_PLUGIN = {"VLLM_PLUGINS": "lora_filesystem_resolver"}


def run_child(platform: str, *args: str, env: dict[str, str] | None = None) -> list:
    """One platform's matrix records, from a fresh process."""
    argv = ["-m", "tests.reliability.matrix", "--platform", platform, *args]
    return json_from_out_file(argv, env)


def run_matrix(workers: int = 2) -> dict[str, dict[str, list]]:
    """Per platform: records with the plugin, and bf16-only records without it."""
    jobs = [(p, "plugin") for p in PLATFORMS] + [(p, "stock") for p in PLATFORMS]
    with tempfile.TemporaryDirectory() as stages, ThreadPoolExecutor(workers) as pool:
        # A node without the plugin, first: its stage specs for the
        # partial-install cells.
        foreign = ("--foreign-stages", stages)
        list(
            pool.map(
                lambda platform: run_child(
                    platform, *foreign, "--dump-stock-stages", env=WITHOUT_PLUGIN
                ),
                PARTIAL_INSTALL_PLATFORMS,
            )
        )

        def run(job: tuple[str, str]) -> list:
            platform, kind = job
            if kind == "plugin":
                return run_child(platform, *foreign)
            return run_child(platform, "--same-as-stock", env=WITHOUT_PLUGIN)

        results = list(pool.map(run, jobs))
    runs: dict[str, dict[str, list]] = collections.defaultdict(dict)
    for (platform, kind), records in zip(jobs, results, strict=True):
        runs[platform][kind] = records
    return dict(runs)


def stock_mismatches(plugin: list, stock: list) -> list[str]:
    stock_by_id = {record["id"]: record["result"] for record in stock}
    return [
        record["id"]
        for record in plugin
        if "result" in record and record["result"] != stock_by_id.get(record["id"])
    ]


def count(runs: dict[str, dict[str, list]]) -> dict[str, Any]:
    rows = {}
    for platform, kinds in runs.items():
        outcomes = collections.Counter(
            record["verdict"]["outcome"]
            for record in kinds["plugin"]
            if "verdict" in record
        )
        as_stock = [record for record in kinds["plugin"] if "result" in record]
        rows[platform] = {
            "cells": len(kinds["plugin"]),
            "judged_cells": sum(outcomes.values()),
            "uniform": outcomes["uniform"],
            "mixed": outcomes["mixed"],
            "plugin_error": outcomes["plugin_error"],
            "vllm_config_error": outcomes["vllm_config_error"],
            "simulation_limit": outcomes["simulation_limit"],
            "defect": outcomes["defect"],
            "same_as_stock_cells": len(as_stock),
            "differ_from_stock": len(stock_mismatches(kinds["plugin"], kinds["stock"])),
        }
    rows["total"] = {
        key: sum(row[key] for row in rows.values()) for key in next(iter(rows.values()))
    }
    return rows


def render(rows: dict[str, Any]) -> str:
    headers = [
        "platform",
        "cells",
        "judged (not both bf16)",
        "start uniform",
        "start mixed, opted in, all zero",
        "plugin error, fixes start",
        "vLLM rejects input",
        "simulation limit",
        "other",
        "bf16 or no index cache",
        "of those, differ from stock",
    ]
    keys = [
        "cells",
        "judged_cells",
        "uniform",
        "mixed",
        "plugin_error",
        "vllm_config_error",
        "simulation_limit",
        "defect",
        "same_as_stock_cells",
        "differ_from_stock",
    ]
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    for platform, row in rows.items():
        lines.append(
            "| " + " | ".join([platform, *(f"{row[k]:,}" for k in keys)]) + " |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--workers", type=int, default=2)
    options = parser.parse_args()
    rows = count(run_matrix(options.workers))
    print(json.dumps(rows, indent=1) if options.json else render(rows))


if __name__ == "__main__":
    sys.exit(main())
