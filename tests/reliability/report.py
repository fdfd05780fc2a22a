"""Run the whole reliability matrix and count its outcomes.

``python -m tests.reliability.report [--size quick|full] [--json]`` runs
every platform's cells with the plugin, and the cells it must leave as stock
again without it (one child process per simulated GPU, two at a time); the
reliability table in ``docs/reliability.md`` is its output.
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from tests.reliability.matrix import (
    PARTIAL_INSTALL_PLATFORMS,
    PLATFORMS,
    RULE_WITNESSES,
    SIZES,
    hardware_groups,
)
from vllm_minimax_m3_kv_sim.environments import STOCK_VLLM
from vllm_minimax_m3_kv_sim.plumbing.children import json_from_out_file


def run_child(platforms: list[str], *args: str, env: dict[str, str] | None = None):
    """Matrix records by platform, from one fresh process (one simulated GPU)."""
    argv = ["-m", "tests.reliability.matrix"]
    for platform in platforms:
        argv += ["--platform", platform]
    return json_from_out_file([*argv, *args], env)


def run_matrix(size: str = "quick", workers: int = 2) -> dict[str, dict[str, list]]:
    """Per platform: records with the plugin, and the records of the cells it
    must leave as stock, without it."""
    groups = hardware_groups(list(PLATFORMS))
    jobs = [(group, "plugin") for group in groups] + [
        (group, "stock") for group in groups
    ]
    sized = ("--size", size)
    with tempfile.TemporaryDirectory() as stages, ThreadPoolExecutor(workers) as pool:
        # A node without the plugin, first: its stage specs for the
        # partial-install cells.
        foreign = ("--foreign-stages", stages)
        list(
            pool.map(
                lambda group: run_child(
                    group, *foreign, "--dump-stock-stages", env=STOCK_VLLM
                ),
                hardware_groups(PARTIAL_INSTALL_PLATFORMS),
            )
        )

        def run(job: tuple[list[str], str]) -> dict[str, list]:
            group, kind = job
            if kind == "plugin":
                return run_child(group, *sized, *foreign)
            return run_child(group, *sized, "--same-as-stock", env=STOCK_VLLM)

        results = list(pool.map(run, jobs))
    runs: dict[str, dict[str, list]] = collections.defaultdict(dict)
    for (_, kind), by_platform in zip(jobs, results, strict=True):
        for platform, records in by_platform.items():
            runs[platform][kind] = records
    return {platform: runs[platform] for platform in PLATFORMS}


def run_mutants(size: str = "quick", workers: int = 2) -> dict[str, list[str]]:
    """Each rule taken out in turn, on its witness slice: rule -> failing cells.
    One process per simulated GPU; the rule is restored between mutants."""
    by_hardware: dict[str, list[str]] = collections.defaultdict(list)
    for rule, (platform, *_) in RULE_WITNESSES.items():
        by_hardware[PLATFORMS[platform][0]].append(rule)

    def run(rules: list[str]) -> dict[str, list[str]]:
        platforms = sorted({RULE_WITNESSES[rule][0] for rule in rules})
        return run_child(platforms, "--size", size, "--mutants", *rules)

    found: dict[str, list[str]] = {}
    with ThreadPoolExecutor(workers) as pool:
        for result in pool.map(run, by_hardware.values()):
            found.update(result)
    return found


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
    parser.add_argument("--size", choices=SIZES, default="full")
    parser.add_argument("--workers", type=int, default=2)
    options = parser.parse_args()
    rows = count(run_matrix(options.size, options.workers))
    print(json.dumps(rows, indent=1) if options.json else render(rows))


if __name__ == "__main__":
    sys.exit(main())
