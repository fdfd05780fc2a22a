"""Does the upstream patch, on its own, do what the plugin does on stock vLLM?

The cells: every reliability-matrix cell with an fp8 main, indexer or drafter
cache (``is_fp8_cell``), plus each validator rule's witness slice
(``RULE_WITNESSES``), so every rule of the plugin is exercised. Each cell ends
in one :func:`~tests.reliability.matrix.outcome_class` (config error, uniform
with which indexer dtype, mixed, or how it failed). The two runs must agree
cell by cell, except where a declared difference below says how and why.

``python -m tests.upstream.equivalence --platform P --out F`` runs one
platform's cells in this process, with whatever vLLM ``PYTHONPATH`` gives it:
the test runs it on the patched overlay (``overlay.py``) with the plugin
excluded from ``VLLM_PLUGINS``, and takes the plugin's side from the
reliability matrix's own run on stock vLLM.
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tests.reliability import matrix
from tests.reliability.matrix import RULE_WITNESSES, Cell


def is_fp8_cell(cell: Cell) -> bool:
    """Some cache of the cell's pool is asked to be an fp8 format."""
    asked = (cell.kv_cache_dtype, cell.indexer_kv_dtype, cell.draft_kv_cache_dtype)
    return any(dtype is not None and dtype.startswith("fp8") for dtype in asked)


def _witness_slices(platform: str) -> list[dict[str, str]]:
    return [
        dict(item.split("=", 1) for item in where)
        for witness_platform, *where in RULE_WITNESSES.values()
        if witness_platform == platform
    ]


def equivalence_cells(platform: str, size: str = "full") -> list[Cell]:
    """The declared subset: fp8 cells and every rule's witnesses."""
    witnesses = _witness_slices(platform)
    return [
        cell
        for cell in matrix.cells(platform, size)
        if cell.foreign_stage is None  # see EXCLUDED_CELLS
        and (is_fp8_cell(cell) or any(matrix.matches(cell, w) for w in witnesses))
    ]


EXCLUDED_CELLS = {
    "partial_install": (
        "cells with one PP stage built by a node without the plugin test the "
        "plugin's own install check; a vLLM that carries the fix carries it on "
        "every node, so there is nothing to compare. (The matrix runs them "
        "only when given a stock node's stages.)"
    ),
}
"""Matrix cell kinds the equivalence run leaves out, and why."""


@dataclass(frozen=True)
class DeclaredDifference:
    """Cells where the patch deliberately ends differently from the plugin."""

    name: str
    why: str
    applies: Callable[[Cell], bool]
    plugin: frozenset[str]
    upstream: frozenset[str]


DECLARED_DIFFERENCES = (
    DeclaredDifference(
        "mixed_pool_opt_in",
        "VLLM_MINIMAX_M3_KV_ALLOW_MIXED starts a mixed pool only because the "
        "plugin's zeroing patch (mirroring vLLM PR #64472) makes every worker "
        "and the scheduler zero new blocks. Without #64472 in vLLM a mixed "
        "pool is unsafe, so the patch refuses every mixed pairing; once "
        "#64472 lands those refusals can become warnings.",
        lambda cell: cell.allow_mixed,
        plugin=frozenset({"mixed", "simulation_limit"}),
        upstream=frozenset({"config_error"}),
    ),
    DeclaredDifference(
        "aiter_without_msa_kernels",
        "The plugin refuses an fp8 indexer when the installed aiter lacks the "
        "MSA kernels (aiter.ops.msa_block_select / msa_attention). vLLM's ROCm "
        "images pin an aiter that has them; checking at config time would mean "
        "importing aiter (and its GPU libraries) in the API server. The patch "
        "leaves that to vLLM's aiter pin, so there the MSA indexer is selected "
        "and fails on its first kernel import (where the plugin, opted in to "
        "a mixed pool, keeps the bf16 indexer instead).",
        lambda cell: cell.aiter_state == "no_msa",
        plugin=frozenset({"config_error", "mixed"}),
        upstream=frozenset({"msa_kernels_missing"}),
    ),
)


def explain(cell: Cell, plugin: str, upstream: str) -> str | None:
    """The declared difference that covers a disagreement, if any."""
    for difference in DECLARED_DIFFERENCES:
        if (
            difference.applies(cell)
            and plugin in difference.plugin
            and upstream in difference.upstream
        ):
            return difference.name
    return None


@dataclass
class Comparison:
    """One platform's cells, plugin on stock vLLM against the patched vLLM."""

    tally: collections.Counter[str]
    """``same <class>`` per agreeing class, and each declared difference."""
    unexplained: list[tuple[str, str, str, str | None]]
    """(cell, plugin's class, patched class, patched message) otherwise."""


def compare(
    platform: str, plugin_records: list[dict], run: dict, size: str = "full"
) -> Comparison:
    plugin = {record["id"]: record["class"] for record in plugin_records}
    cells = {cell.id: cell for cell in equivalence_cells(platform, size)}
    if len(run["records"]) != len(cells):
        raise AssertionError(f"{platform}: ran {len(run['records'])} of {len(cells)}")
    comparison = Comparison(collections.Counter(), [])
    for record in run["records"]:
        ours, theirs = plugin[record["id"]], record["class"]
        if ours == theirs:
            comparison.tally[f"same {ours.split('/')[0]}"] += 1
            continue
        declared = explain(cells[record["id"]], ours, theirs)
        if declared is None:
            comparison.unexplained.append(
                (record["id"], ours, theirs, record.get("message"))
            )
        else:
            comparison.tally[declared] += 1
    return comparison


def run(platform: str, size: str = "full") -> dict:
    import vllm

    import vllm_minimax_m3_kv

    matrix.use_platform(platform)
    records = []
    for cell in equivalence_cells(platform, size):
        result = matrix.run_cell(cell)
        record = {"id": cell.id, "class": matrix.outcome_class(cell, result)}
        if "config_error" in result:
            record["message"] = result["config_error"]["message"][:300]
        records.append(record)
    return {
        "vllm": vllm.__file__,
        # None: vLLM never called the plugin's register() in this process.
        "plugin_registered": vllm_minimax_m3_kv._registered,
        "plugin_applied": list(vllm_minimax_m3_kv._applied),
        "records": records,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument(
        "--platform",
        choices=sorted(matrix.PLATFORMS),
        action="append",
        required=True,
        help="repeatable: platforms of one simulated GPU share a process",
    )
    parser.add_argument("--size", choices=matrix.SIZES, default="full")
    parser.add_argument("--out", required=True)
    options = parser.parse_args()
    runs = {platform: run(platform, options.size) for platform in options.platform}
    Path(options.out).write_text(json.dumps(runs))


if __name__ == "__main__":
    sys.exit(main())
