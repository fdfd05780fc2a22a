"""Do the upstream patches, on their own, do what the plugin does on stock vLLM?

The cells: every reliability-matrix cell with an fp8 main, indexer or drafter
cache (``is_fp8_cell``), plus each validator rule's witness slice
(``RULE_WITNESSES``), so every rule of the plugin is exercised. Each cell ends
in one :func:`~tests.reliability.matrix.outcome_class` (config error, uniform
with which indexer dtype, mixed, or how it failed). Two series are compared
with the plugin: PR 1 alone (``pr1``: the fp8 default) and PR 1 + PR 3
(``pr1_pr3``: with the checkpoint's kv_cache_scheme resolved per layer, so
the checkpoint-KV cells run too). Neither refuses anything, so both differ
by design wherever the plugin refuses; and both keep vLLM 0.33's description
of the index cache (PR 2 is retired), so where the plugin starts a uniform
pool they start the same index-cache dtype in a pool vLLM still zeroes. The
runs must agree cell by cell, except where a declared difference below says
how and why.

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
import re
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


def equivalence_cells(
    platform: str, size: str = "full", series: str = "pr1"
) -> list[Cell]:
    """The declared subset: fp8 cells and every rule's witnesses (with PR 3,
    the checkpoint-KV cells too)."""
    witnesses = _witness_slices(platform)
    with_checkpoint_kv = series in SERIES_WITH_PR3
    return [
        cell
        for cell in matrix.cells(platform, size)
        if cell.foreign_stage is None  # see EXCLUDED_CELLS
        and (with_checkpoint_kv or cell.checkpoint not in matrix.CHECKPOINT_KV)
        and (
            is_fp8_cell(cell)
            or cell.checkpoint in matrix.CHECKPOINT_KV
            or any(matrix.matches(cell, w) for w in witnesses)
        )
    ]


EXCLUDED_CELLS = {
    "partial_install": (
        "cells with one PP stage built by a node without the plugin test the "
        "plugin's own install check; a vLLM that carries the fix carries it on "
        "every node, so there is nothing to compare. (The matrix runs them "
        "only when given a stock node's stages.)"
    ),
    "checkpoint_kv": (
        "from PR 1 alone: checkpoints that declare their own KV cache "
        "(matrix.CHECKPOINT_KV). PR 1 reads cache_config.cache_dtype as the "
        "config hooks see it, which stock 0.33 leaves at auto for a "
        "compressed-tensors kv_cache_scheme (Attention.__init__ applies it at "
        "model build). PR 3 resolves it per layer: the pr1_pr3 series runs "
        "these cells."
    ),
}
"""Matrix cell kinds the equivalence run leaves out, and why."""


SERIES = ("pr1", "pr1_pr3")
"""``pr1``: upstream PR 1 alone (the default). ``pr1_pr3``: with PR 3 (the
checkpoint's kv_cache_scheme resolved per layer) too."""
SERIES_WITH_PR3 = ("pr1_pr3",)


@dataclass(frozen=True)
class DeclaredDifference:
    """Cells where a patch series deliberately ends differently from the plugin."""

    name: str
    why: str
    applies: Callable[[Cell], bool]
    plugin: frozenset[str]
    upstream: dict[str, frozenset[str]]
    """Per series, the classes it may end in instead; ``kind:*`` (``kind/*``)
    matches any ``kind:...`` (``kind/...``) class."""
    built: Callable[[list[str]], bool] = lambda precisions: True
    """What the patched run's pool must hold (its ``dtype/quant mode`` set)."""


FAILS_AT_MODEL_BUILD = frozenset(
    {"build_error:*", "plan_error:*", "msa_kernels_missing", "simulation_limit"}
)
"""vLLM's own error at model build or KV planning (``simulation_limit``: a KV
cache dtype whose kernels this CPU cannot stand in for, refused there too)."""
AS_IN_VLLM_0_33 = FAILS_AT_MODEL_BUILD | {"zeroing_needed"}
"""How a pool vLLM 0.33 is let build ends: mixed and needing zeroing, or the
model-build error stock vLLM gives (e.g. an fp8 indexer where none runs)."""

BOTH = SERIES
INDEX_CACHE_FP8_AS_IN_0_33 = "torch.float8_e4m3fn/NONE"
"""How vLLM 0.33 describes an fp8 index cache; no main cache is described so."""
FP8_POOL_AS_IN_0_33 = {"torch.uint8/FP8_PER_TENSOR", INDEX_CACHE_FP8_AS_IN_0_33}
"""An fp8 e4m3 main cache beside an fp8 index cache, as vLLM 0.33 describes them."""

DECLARED_DIFFERENCES = (
    DeclaredDifference(
        "non_breaking",
        "Neither PR adds an error: where the plugin refuses a pairing at "
        "config time, vLLM runs it as 0.33 does (a mixed pool, which vLLM PR "
        "#64472 zeroes correctly in core, or vLLM's own model-build error). "
        "Refusing those is the plugin's strict validator's job, not a default "
        "vLLM should take.",
        lambda cell: True,
        plugin=frozenset({"config_error"}),
        upstream=dict.fromkeys(BOTH, AS_IN_VLLM_0_33),
    ),
    DeclaredDifference(
        "indexer_cp_left_alone",
        "With indexer CP requested on ROCm, the plugin lets 'auto' follow an "
        "fp8 KV cache (the AITER MSA CP indexer). PR 1 leaves CP's index cache "
        "dtype alone, so an explicit CP user gets what 0.33 gives: the bf16 "
        "Triton CP indexer in a mixed pool, or, with the AITER attend at more "
        "than one KV head per rank (TP 2), vLLM's own model-build error (that "
        "attend needs the MSA indexer's page table).",
        lambda cell: cell.indexer_cp and not cell.platform.startswith("sm"),
        plugin=frozenset({"uniform/indexer=fp8"}),
        upstream=dict.fromkeys(BOTH, AS_IN_VLLM_0_33),
    ),
    DeclaredDifference(
        "described_as_in_0_33",
        "Both series give the index cache fp8 where the plugin does, but "
        "describe it as 0.33 does, (float8_e4m3fn, NONE) beside the main "
        "cache's (uint8, FP8_PER_TENSOR): vLLM counts two precisions and its "
        "workers zero new blocks (its scheduler too once vLLM PR #64472 is "
        "in). The plugin describes it like the main cache; upstream, that "
        "description was PR 2, retired (docs/upstream.md).",
        lambda cell: True,
        plugin=frozenset({"uniform/indexer=fp8", "uniform/indexer=fp8_e4m3"}),
        upstream=dict.fromkeys(BOTH, frozenset({"zeroing_needed"})),
        # The pool holds the plugin's bytes, described as 0.33 does: fp8 main
        # caches and fp8 index caches (the MTP drafter's too), nothing bf16
        # that would also end "zeroing_needed".
        built=lambda precisions: set(precisions) == FP8_POOL_AS_IN_0_33,
    ),
    DeclaredDifference(
        "rocm_triton_fp8_indexer",
        "On gfx950 where the AITER MSA indexer is not selected (AITER sparse "
        "PA off, a checkpoint off its shape, a context past its top-k), the "
        "plugin opens vLLM's Triton indexer to an fp8 index cache "
        "(minimax_m3_rocm_fp8_triton_indexer). PR 1 follows vLLM's gates, "
        "which allow fp8 there only on CUDA: 'auto' stays bf16 (a mixed pool, "
        "as 0.33), and an explicit fp8 indexer fails at model build, as 0.33. "
        "On gfx942 the same holds for an e4m3fnuz index cache, written by the "
        "plugin's minimax_m3_rocm_fnuz_index_writer. "
        "The gate change awaits its own upstream PR (docs/upstream.md).",
        lambda cell: cell.platform.startswith(("mi355x", "mi300x")),
        plugin=frozenset({"uniform/indexer=fp8", "uniform/indexer=fp8_e4m3"}),
        upstream=dict.fromkeys(BOTH, AS_IN_VLLM_0_33),
    ),
    DeclaredDifference(
        "default_scoped_to_sm10x",
        "On CUDA, PR 1's default applies on SM10x only, where an fp8 index "
        "cache has published evaluations (vLLM #45892; round-4 review). The "
        "plugin inherits fp8 wherever vLLM's fp8 indexer runs, Hopper too. "
        "There PR 1 leaves 'auto' bf16: a mixed pool, as 0.33. A wider "
        "default is a follow-up that needs long-context data "
        "(docs/upstream.md).",
        lambda cell: cell.platform.startswith("sm") and cell.platform != "sm100",
        plugin=frozenset({"uniform/indexer=fp8", "uniform/indexer=fp8_e4m3"}),
        # PR 1 + PR 3 runs no CUDA platform but SM100 (report.py).
        upstream={"pr1": frozenset({"zeroing_needed"})},
    ),
    DeclaredDifference(
        "scheme_resolved_per_layer",
        "PR 3 resolves a compressed-tensors kv_cache_scheme per layer (round-4 "
        "review, semantics (b)), not into --kv-cache-dtype: config hooks still "
        "see 'auto', so PR 1's hook leaves the index cache bf16 beside the fp8 "
        "main caches every layer now gets: a mixed pool, as 0.33 builds with "
        "an explicit bf16 index cache. The plugin resolves the scheme at config "
        "time for MiniMax-M3 only, and its hook inherits fp8.",
        lambda cell: (
            cell.checkpoint in ("ct_fp8_kv", "ct_fp8_kv_sparse_first")
            and cell.kv_cache_dtype in (None, "auto")
        ),
        plugin=frozenset({"uniform/indexer=fp8", "uniform/indexer=fp8_e4m3"}),
        upstream={"pr1_pr3": frozenset({"zeroing_needed"})},
    ),
    DeclaredDifference(
        "no_index_cache",
        "A checkpoint with no sparse layer and no MTP drafter builds no index "
        "cache. The plugin then leaves 'auto' as it is; PR 1's hook does not "
        "look for sparse layers (fewer lines) and sets the dtype no cache "
        "uses. The pool is the same.",
        lambda cell: not cell.has_index_cache,
        plugin=frozenset({"uniform/indexer=auto"}),
        upstream=dict.fromkeys(BOTH, frozenset({"uniform/indexer=fp8"})),
    ),
    DeclaredDifference(
        "mixed_pool_opt_in",
        "VLLM_MINIMAX_M3_KV_ALLOW_MIXED starts a mixed pool only because the "
        "plugin's zeroing patch (mirroring vLLM PR #64472) makes every worker "
        "and the scheduler zero new blocks. The PRs leave such a pool as 0.33 "
        "does: mixed, zeroed correctly once #64472 is in vLLM.",
        lambda cell: cell.allow_mixed,
        plugin=frozenset({"mixed", "simulation_limit"}),
        upstream=dict.fromkeys(BOTH, AS_IN_VLLM_0_33),
    ),
)


def _allowed(outcome: str, classes: frozenset[str]) -> bool:
    kind = re.split(r"[:/]", outcome)[0]
    return outcome in classes or f"{kind}:*" in classes or f"{kind}/*" in classes


def explain(
    cell: Cell,
    plugin: str,
    upstream: str,
    series: str,
    precisions: list[str] | None = None,
) -> str | None:
    """The declared difference that covers a disagreement, if any."""
    for difference in DECLARED_DIFFERENCES:
        if (
            difference.applies(cell)
            and plugin in difference.plugin
            and _allowed(upstream, difference.upstream.get(series, frozenset()))
            and difference.built(precisions or [])
        ):
            return difference.name
    return None


@dataclass
class Comparison:
    """One platform's cells, plugin on stock vLLM against a patched vLLM."""

    tally: collections.Counter[str]
    """``same <class>`` per agreeing class, and each declared difference."""
    unexplained: list[tuple[str, str, str, str | None]]
    """(cell, plugin's class, patched class, patched message) otherwise."""


def compare(
    platform: str,
    plugin_records: list[dict],
    run: dict,
    series: str,
    size: str = "full",
) -> Comparison:
    plugin = {record["id"]: record["class"] for record in plugin_records}
    cells = {cell.id: cell for cell in equivalence_cells(platform, size, series)}
    if len(run["records"]) != len(cells):
        raise AssertionError(f"{platform}: ran {len(run['records'])} of {len(cells)}")
    comparison = Comparison(collections.Counter(), [])
    for record in run["records"]:
        ours, theirs = plugin[record["id"]], record["class"]
        if ours == theirs:
            comparison.tally[f"same {ours.split('/')[0]}"] += 1
            continue
        declared = explain(
            cells[record["id"]], ours, theirs, series, record.get("precisions")
        )
        if declared is None:
            comparison.unexplained.append(
                (record["id"], ours, theirs, record.get("message"))
            )
        else:
            comparison.tally[declared] += 1
    return comparison


def run(platform: str, size: str = "full", series: str = "pr1") -> dict:
    import vllm

    import vllm_minimax_m3_kv

    matrix.use_platform(platform)
    records = []
    for cell in equivalence_cells(platform, size, series):
        result = matrix.run_cell(cell)
        record = {
            "id": cell.id,
            "class": matrix.outcome_class(cell, result),
            "precisions": result.get("precisions", []),
            # The index-cache dtype the config resolved (None: refused first).
            "indexer_kv_dtype": result.get("indexer_kv_dtype"),
        }
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
    parser.add_argument(
        "--series", choices=SERIES, default="pr1", help="which cells to run"
    )
    parser.add_argument("--out", required=True)
    options = parser.parse_args()
    runs = {
        platform: run(platform, options.size, options.series)
        for platform in options.platform
    }
    Path(options.out).write_text(json.dumps(runs))


if __name__ == "__main__":
    sys.exit(main())
