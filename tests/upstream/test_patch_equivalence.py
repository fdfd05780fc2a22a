"""The upstream patch (``upstream/``): it applies to the installed vLLM 0.33,
its own tests pass there, and without the plugin it reaches the plugin's
outcome on every fp8 cell of the reliability matrix, except the declared
differences in ``equivalence.py``.
"""

from __future__ import annotations

import collections
import json
import re
from pathlib import Path

import pytest

from sim.process import json_from_out_file, run_python
from tests.reliability.matrix import RULE_WITNESSES, matches
from tests.upstream import equivalence, overlay
from tests.upstream.report import run_patched


@pytest.fixture(scope="module")
def patched(tmp_path_factory) -> overlay.Overlay:
    return overlay.build(tmp_path_factory.mktemp("upstream"))


def test_patch_applies_to_the_installed_vllm_and_changes_only_copies(patched):
    installed = overlay.installed_vllm()
    changed = [
        path
        for path in patched.patched
        if not (installed / path.removeprefix("vllm/")).is_file()
        or (patched.root / path).read_bytes()
        != (installed / path.removeprefix("vllm/")).read_bytes()
    ]
    assert changed == list(patched.patched)
    for path in patched.patched:
        assert not (patched.root / path).is_symlink(), path
    # Everything else is the installed package itself.
    assert (patched.root / "vllm" / "envs.py").resolve() == installed / "envs.py"


def _pytest_in_child(tests: Path, cwd: Path, env: dict[str, str]) -> tuple[int, str]:
    proc = run_python(
        ["-m", "pytest", "-q", "-p", "no:cacheprovider", str(tests)],
        env,
        timeout=600,
        cwd=cwd,
    )
    return proc.returncode, proc.stdout[-3000:] + proc.stderr[-3000:]


def test_patch_unit_tests_pass_on_the_patched_vllm_and_fail_on_stock(patched, tmp_path):
    # From outside both source trees, as vLLM's CI runs against an install.
    returncode, output = _pytest_in_child(
        patched.tests, tmp_path, overlay.child_env(patched)
    )
    assert returncode == 0, output
    passed = re.search(r"(\d+) passed", output)
    assert passed and int(passed.group(1)) >= 30, output
    # The same tests on stock vLLM 0.33: they test the patch, not vLLM.
    stock = {**overlay.child_env(patched), "PYTHONPATH": ""}
    returncode, output = _pytest_in_child(patched.tests, tmp_path, stock)
    assert returncode != 0 and "index_cache_dtype" in output, output


# Also run with the plugin installed on the patched vLLM, as during the move.
WITH_PLUGIN_PLATFORMS = ("mi355x-aiter-spa", "sm100")


@pytest.fixture(scope="module")
def upstream_runs(patched, matrix_size) -> dict[str, dict[str, dict]]:
    """The equivalence cells on the patched vLLM, per platform: ``alone``
    (plugin excluded) and ``with_plugin`` (both installed)."""
    return {
        "alone": run_patched(patched, size=matrix_size),
        "with_plugin": run_patched(
            patched, WITH_PLUGIN_PLATFORMS, with_plugin=True, size=matrix_size
        ),
    }


# What the plugin still does on a vLLM carrying the fix; the rest is vLLM's.
NOT_IN_THE_PATCH = ["minimax_m3_kv_zeroing_decision", "minimax_m3_kv_allow_mixed_env"]


def test_children_ran_the_patched_vllm(patched, upstream_runs):
    for kind, registered, applied in (
        ("alone", None, []),
        ("with_plugin", True, NOT_IN_THE_PATCH),
    ):
        for platform, run in upstream_runs[kind].items():
            assert Path(run["vllm"]).is_relative_to(patched.root), platform
            assert run["plugin_registered"] is registered, (kind, platform)
            # On the patched vLLM the plugin's own hook and cache entries
            # stand down (patches.Patch.superseded).
            assert run["plugin_applied"] == applied, (kind, platform)


def test_check_on_a_patched_vllm_still_judges_the_target_gpu(patched, tmp_path):
    """``check`` runs vLLM's config validation on this CPU, where a vLLM
    carrying the fix refuses an fp8 KV cache for the CPU itself."""
    cases = [
        {
            "argv": ["--target", "mi355x", "--kv-cache-dtype", "fp8", "-tp", "8"],
            "env": {
                "VLLM_ROCM_USE_AITER": "1",
                "VLLM_ROCM_SHUFFLE_KV_CACHE_LAYOUT": "1",
            },
        },
        {"argv": ["--target", "mi300x", "--kv-cache-dtype", "fp8", "-tp", "8"]},
        {"argv": ["--target", "b300", "--kv-cache-dtype", "fp8", "-tp", "3"]},
    ]
    cases_file = tmp_path / "cases.json"
    cases_file.write_text(json.dumps(cases))
    env = overlay.child_env(patched)
    del env["VLLM_PLUGINS"]
    argv = ["-m", "sim.check_batch", str(cases_file)]
    inherits, refused, bad_tp = json_from_out_file(argv, env)
    assert inherits["exit"] == 0, inherits["stderr"]
    assert inherits["plan"]["indexer_inherited"], inherits["plan"]
    assert refused["exit"] == 2, refused["stderr"]
    # vLLM's other validation still speaks: 4 KV heads do not split over TP 3.
    assert bad_tp["exit"] == 1, bad_tp


def test_equivalence_cells_cover_every_rule():
    for rule, (platform, *where) in RULE_WITNESSES.items():
        witnesses = dict(item.split("=", 1) for item in where)
        cells = equivalence.equivalence_cells(platform)
        assert any(matches(cell, witnesses) for cell in cells), rule


def _compare(
    reliability_matrix: dict, runs: dict[str, dict], size: str
) -> tuple[collections.Counter[str], list]:
    tally: collections.Counter[str] = collections.Counter()
    unexplained = []
    for platform, run in runs.items():
        plugin = reliability_matrix[platform]["plugin"]
        comparison = equivalence.compare(platform, plugin, run, size)
        tally.update(comparison.tally)
        unexplained += comparison.unexplained
    return tally, unexplained


def test_upstream_patch_reaches_the_plugins_outcome(
    reliability_matrix, upstream_runs, matrix_size
):
    tally, unexplained = _compare(
        reliability_matrix, upstream_runs["alone"], matrix_size
    )
    assert not unexplained, json.dumps(unexplained[:10], indent=1)
    # Both sides start uniform pools and refuse mixed ones, many times over.
    assert tally["same uniform"] > 50 and tally["same config_error"] > 1000, tally
    # Every declared difference is one the cells actually show.
    for difference in equivalence.DECLARED_DIFFERENCES:
        assert tally[difference.name] > 0, (difference.name, tally)
    print(json.dumps(tally, indent=1))


def test_plugin_on_a_patched_vllm_keeps_the_patched_outcome(
    reliability_matrix, upstream_runs, matrix_size
):
    """Both installed: the patch decides first, and the plugin agrees with it
    (its opt-in cannot reopen what the patch refuses)."""
    tally, unexplained = _compare(
        reliability_matrix, upstream_runs["with_plugin"], matrix_size
    )
    assert not unexplained, json.dumps(unexplained[:10], indent=1)
    assert tally["same uniform"] > 100, tally
    alone = upstream_runs["alone"]
    for platform, run in upstream_runs["with_plugin"].items():
        assert run["records"] == alone[platform]["records"], platform
