"""The reliability matrix (``tests/reliability/matrix.py``), judged.

Every fp8 cell starts uniform or stops at config time with a plugin error
whose fixes start; fp8-free cells behave as stock vLLM; and taking out any
one validator rule makes some cell fail, so no rule is dead weight.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest

from tests.reliability.covering import covers_every_pair
from tests.reliability.matrix import (
    CHECKPOINTS,
    PLATFORMS,
    POOL_SHAPE_AXES,
    POOL_SHAPE_ROWS,
    RULE_WITNESSES,
    SHAPE_AXES,
    SHAPE_ROWS,
    SIZES,
    SPARSE_LAYERS,
    Cell,
    apply_fix,
    cells,
    matches,
    parse_fixes,
)
from tests.reliability.report import count, run_mutants, stock_mismatches
from vllm_minimax_m3_kv.config.indexer_precision import (
    DRAFTER_RULES,
    PAIRING_RULES,
    SCOPE_RULES,
    decide,
)
from vllm_minimax_m3_kv.config.pool_facts import PlatformFacts, PrecisionFacts
from vllm_minimax_m3_kv.config.vllm_gates import FP8_INDEXER_RULES
from vllm_minimax_m3_kv_sim.plumbing.children import json_from_stdout


@pytest.fixture(scope="module")
def matrix(reliability_matrix):
    return reliability_matrix


def _defects(records: list) -> list:
    return [r for r in records if r.get("verdict", {}).get("outcome") == "defect"]


def test_every_fp8_cell_starts_uniform_or_fails_at_config_with_working_fixes(
    matrix,
):
    defects = {
        platform: _defects(kinds["plugin"]) for platform, kinds in matrix.items()
    }
    shown = [d for found in defects.values() for d in found][:3]
    assert not shown, json.dumps(shown, indent=1)[:6000]
    rows = count(matrix)
    total = rows["total"]
    assert total["defect"] == 0
    # Outcomes the table promises, not an empty or one-sided matrix.
    assert total["uniform"] > 0 and total["plugin_error"] > 0
    assert total["judged_cells"] == sum(
        total[key]
        for key in (
            "uniform",
            "mixed",
            "plugin_error",
            "vllm_config_error",
            "simulation_limit",
        )
    )
    for platform in ("mi355x-aiter-spa", "sm100", "sm90"):
        assert rows[platform]["uniform"] > 0, platform
    # The opt-in starts mixed pools, zeroed everywhere, on every platform.
    for platform in PLATFORMS:
        assert rows[platform]["mixed"] > 0, platform


def test_bf16_and_index_cache_free_cells_behave_as_stock_vllm(matrix):
    for platform, kinds in matrix.items():
        assert len(kinds["stock"]) == count(matrix)[platform]["same_as_stock_cells"]
        mismatches = stock_mismatches(kinds["plugin"], kinds["stock"])
        assert not mismatches, (platform, mismatches[:5])


def test_launch_script_recipes_start_uniform(matrix):
    for platform in ("mi355x-aiter-spa", "sm100"):
        records = {r["id"]: r for r in matrix[platform]["plugin"]}
        for indexer, (tp, pp) in itertools.product((None, "fp8"), ((8, 1), (4, 2))):
            cell = Cell(platform, "fp8", indexer, tp, pp, "mtp", False, 8192)
            assert records[cell.id]["verdict"] == {"outcome": "uniform"}, cell.id


def test_fix_parsing_round_trips_the_policy_fixes():
    verdict = decide(
        PrecisionFacts(
            platform=PlatformFacts(
                "ROCm gfx950",
                "rocm",
                rocm_gfx950=True,
                aiter_enabled=True,
                shuffle_kv_cache_layout=True,
            ),
            kv_cache_dtype="fp8",
            indexer_kv_dtype="auto",
            max_model_len=8193 * 128,
            kv_heads_per_rank=4,
        )
    )
    parsed = parse_fixes(verdict.message)
    assert parsed == [
        {
            "flags": list(map(list, fix.flags)),
            "env": dict(fix.env),
            "requires": list(fix.requires),
            "without": list(fix.without),
        }
        for fix in verdict.fixes
    ]
    # One fix per indexer: vLLM's Triton indexer (AITER sparse PA off), the
    # AITER MSA indexer (a context its top-k holds).
    cell = Cell("mi355x", "fp8", None, 1, 1, "none", False, 8193 * 128)
    triton = apply_fix(cell, parsed[0])
    assert dict(triton.env)["VLLM_ROCM_SHUFFLE_KV_CACHE_LAYOUT"] == "0"
    assert triton.max_model_len == 8193 * 128
    msa = apply_fix(cell, parsed[1])
    assert msa.max_model_len == 8192 * 128


def test_covering_designs_cover_every_pair():
    for rows, axes in ((SHAPE_ROWS, SHAPE_AXES), (POOL_SHAPE_ROWS, POOL_SHAPE_AXES)):
        assert covers_every_pair(rows, axes)
        product = 1
        for values in axes.values():
            product *= len(values)
        assert len(rows) < product / 4  # a design, not the product


def test_declared_sparse_layers_are_what_the_checkpoints_mark():
    for name, path in CHECKPOINTS.items():
        text = json.loads((Path(path) / "config.json").read_text())["text_config"]
        freq = text["sparse_attention_config"]["sparse_attention_freq"]
        marked = tuple(i for i, flag in enumerate(freq) if flag)
        assert marked == SPARSE_LAYERS[name], name


def test_every_rule_is_listed():
    names = {rule.name for rule in FP8_INDEXER_RULES}
    names |= {rule.name for rule in PAIRING_RULES}
    names |= {rule.name for rule in DRAFTER_RULES}
    names |= {rule.name for rule in SCOPE_RULES}
    assert names == set(RULE_WITNESSES)
    assert all(args[0] in PLATFORMS for args in RULE_WITNESSES.values())


def test_removing_any_single_rule_makes_a_cell_fail(matrix_size):
    found = run_mutants(matrix_size)
    assert set(found) == set(RULE_WITNESSES)
    survivors = [rule for rule, failing in found.items() if not failing]
    assert not survivors, f"no cell fails without: {survivors}"


def test_every_rule_witness_is_in_both_sizes():
    for rule, (platform, *where) in RULE_WITNESSES.items():
        wanted = dict(item.split("=", 1) for item in where)
        for size in SIZES:
            assert any(matches(c, wanted) for c in cells(platform, size)), (rule, size)


def test_quick_size_keeps_every_shape_row_and_every_kv_dtype_and_opt_in():
    quick, full = cells("sm100", "quick"), cells("sm100", "full")
    assert len(quick) < len(full) / 4
    verdicts = {(c.kv_cache_dtype, c.env) for c in full}
    assert verdicts == {(c.kv_cache_dtype, c.env) for c in quick}
    shape = ("tensor_parallel_size", "pipeline_parallel_size", "speculative")
    rows = {tuple(getattr(c, a) for a in shape) for c in quick}
    assert {tuple(r[a] for a in shape) for r in SHAPE_ROWS} <= rows


LIVE_AGREEMENT_EXAMPLES = {"quick": 40, "full": 150}


@pytest.mark.parametrize("platform", ["mi355x", "mi300x", "b300", "h200", "a100"])
def test_live_hook_agrees_with_offline_decision(platform, matrix_size):
    argv = ["-m", "tests.reliability.live_agreement", "--platform", platform]
    examples = LIVE_AGREEMENT_EXAMPLES[matrix_size]
    tally = json_from_stdout([*argv, "--examples", str(examples)])
    assert tally["error"] > 0 and tally["mixed"] > 0, tally
    if platform in ("mi355x", "mi300x", "b300", "h200"):
        assert tally["runs"] > tally["mixed"], tally
