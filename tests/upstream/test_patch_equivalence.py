"""The upstream patches (``upstream/``): they apply to the installed vLLM
0.33 in order, their own tests pass there (on simulated GPUs) and fail on stock
vLLM, and without the plugin they reach the plugin's outcome on every fp8 cell
of the reliability matrix wherever it starts a uniform pool (PR 1 the same
indexer dtype, PR 1 + PR 2 the same pool), except the declared differences in
``equivalence.py``.
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
from tests.upstream.report import PLATFORMS_BY_SERIES, run_patched


@pytest.fixture(scope="module")
def pr1(tmp_path_factory) -> overlay.Overlay:
    return overlay.build(tmp_path_factory.mktemp("pr1"), overlay.PR1)


@pytest.fixture(scope="module")
def pr1_pr2(tmp_path_factory) -> overlay.Overlay:
    return overlay.build(tmp_path_factory.mktemp("pr1_pr2"), overlay.PATCHES)


def test_patches_apply_to_the_installed_vllm_and_change_only_copies(pr1, pr1_pr2):
    installed = overlay.installed_vllm()
    assert len(overlay.PATCHES) == 2
    for patched in (pr1, pr1_pr2):
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
    # PR 2 only changes what PR 1 added.
    assert set(pr1_pr2.patched) == set(pr1.patched)


def test_no_patch_adds_an_error_or_grows_past_its_budget():
    """Neither PR refuses what stock vLLM 0.33 starts: no added line under
    vllm/ raises. PR 1 stays small (about 60 code lines under vllm/)."""
    for patch in overlay.PATCHES:
        added = []
        current = ""
        for line in patch.read_text().splitlines():
            if line.startswith("+++ b/"):
                current = line.removeprefix("+++ b/")
            elif line.startswith("+") and current.startswith("vllm/"):
                added.append(line[1:])
        assert not [line for line in added if "raise " in line], patch.name
        code = [
            line for line in added if line.strip() and not line.strip().startswith("#")
        ]
        assert len(code) <= 60, (patch.name, len(code))


# Simulated GPUs the patches' own tests run on (one process each): where an
# fp8 indexer runs (CUDA fp8; ROCm gfx950 with the AITER sparse PA attend) and
# where none does.
# PR 1's tests are a part of PR 1 + PR 2's file, so B200 and MI300X (no fp8
# indexer: "auto" stays) run once, with both.
OWN_TEST_HARDWARE = {
    "pr1": [
        {
            "SIM_HARDWARE": "mi355x",
            "VLLM_ROCM_USE_AITER": "1",
            "VLLM_ROCM_SHUFFLE_KV_CACHE_LAYOUT": "1",
        },
    ],
    "pr1_pr2": [{"SIM_HARDWARE": "b200"}, {"SIM_HARDWARE": "mi300x"}],
}
OWN_TESTS_PASSED = {"pr1": 9, "pr1_pr2": 15}
"""Each series' own tests that pass here (the LLM test is skipped: no GPU)."""


def _pytest_in_child(tests: Path, cwd: Path, env: dict[str, str]) -> tuple[int, str]:
    proc = run_python(
        [
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-p",
            "sim.pytest_hardware",
            str(tests),
        ],
        env,
        timeout=600,
        cwd=cwd,
    )
    return proc.returncode, proc.stdout[-3000:] + proc.stderr[-3000:]


@pytest.mark.parametrize("series", ["pr1", "pr1_pr2"])
def test_patch_unit_tests_pass_on_the_patched_vllm(series, request, tmp_path):
    # From outside both source trees, as vLLM's CI runs against an install.
    patched = request.getfixturevalue(series)
    for hardware in OWN_TEST_HARDWARE[series]:
        env = {**overlay.child_env(patched), **hardware}
        returncode, output = _pytest_in_child(patched.tests, tmp_path, env)
        assert returncode == 0, (hardware, output)
        passed = re.search(r"(\d+) passed", output)
        assert passed and int(passed.group(1)) == OWN_TESTS_PASSED[series], output
        assert "1 skipped" in output, output


def test_patch_unit_tests_fail_on_stock_vllm(pr1_pr2, tmp_path):
    """They test the patches, not vLLM: on stock 0.33, on a GPU with an fp8
    indexer, the default's and the description's tests fail, each on its
    assertion (the rest describe what 0.33 already does)."""
    stock = {**overlay.child_env(pr1_pr2), "PYTHONPATH": "", "SIM_HARDWARE": "b200"}
    del stock["VLLM_CACHE_ROOT"]  # stock vLLM's own
    returncode, output = _pytest_in_child(pr1_pr2.tests, tmp_path, stock)
    failed = set(re.findall(r"FAILED \S+::(\w+)", output))
    assert returncode != 0 and failed == {
        "test_auto_follows_an_fp8_kv_cache_where_model_build_builds_an_fp8_indexer",
        "test_an_fp8_index_cache_beside_an_fp8_kv_cache_needs_no_zeroing",
        "test_bind_views_the_uint8_allocation_as_e4m3",
    }, output
    assert "AssertionError" in output and "ImportError" not in output, output


@pytest.fixture(scope="module")
def upstream_runs(pr1, pr1_pr2, matrix_size) -> dict[str, dict[str, dict]]:
    """The equivalence cells on a patched vLLM, per platform: PR 1 alone and
    PR 1 + PR 2 (plugin excluded), and PR 1 with the plugin installed too."""
    platforms = {k: v[matrix_size] for k, v in PLATFORMS_BY_SERIES.items()}
    return {
        "pr1": run_patched(pr1, platforms["pr1"], size=matrix_size),
        "pr1_pr2": run_patched(pr1_pr2, platforms["pr1_pr2"], size=matrix_size),
        "with_plugin": run_patched(
            pr1, platforms["with_plugin"], with_plugin=True, size=matrix_size
        ),
    }


# What the plugin still does on a vLLM carrying PR 1: everything; its strict
# config hook stacks after vLLM's own. (With PR 2 the storage description is
# vLLM's own and that entry stands down.)
ON_PR1 = [
    "minimax_m3_config_hook",
    "minimax_m3_indexer_cache_storage",
    "minimax_m3_kv_zeroing_decision",
    "minimax_m3_kv_allow_mixed_env",
]


def test_children_ran_the_patched_vllm(pr1, pr1_pr2, upstream_runs):
    for kind, patched, registered, applied in (
        ("pr1", pr1, None, []),
        ("pr1_pr2", pr1_pr2, None, []),
        ("with_plugin", pr1, True, ON_PR1),
    ):
        for platform, run in upstream_runs[kind].items():
            assert Path(run["vllm"]).is_relative_to(patched.root), platform
            assert run["plugin_registered"] is registered, (kind, platform)
            assert run["plugin_applied"] == applied, (kind, platform)


@pytest.mark.parametrize("series", ["pr1", "pr1_pr2"])
def test_check_on_a_patched_vllm_still_judges_the_target_gpu(series, request, tmp_path):
    """``check`` runs vLLM's config validation on this CPU, where vLLM's own
    hook would judge the CPU itself (and leave "auto" alone)."""
    patched = request.getfixturevalue(series)
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
    reliability_matrix: dict, runs: dict[str, dict], series: str, size: str
) -> tuple[collections.Counter[str], list]:
    tally: collections.Counter[str] = collections.Counter()
    unexplained = []
    for platform, run in runs.items():
        plugin = reliability_matrix[platform]["plugin"]
        comparison = equivalence.compare(platform, plugin, run, series, size)
        tally.update(comparison.tally)
        unexplained += comparison.unexplained
    return tally, unexplained


def _shown(tally: collections.Counter[str], series: str, size: str) -> None:
    """Every declared difference of the series is one the cells show."""
    for difference in equivalence.DECLARED_DIFFERENCES:
        if series in difference.upstream and (
            size == "full" or not difference.full_size_only
        ):
            assert tally[difference.name] > 0, (difference.name, tally)


def test_pr1_gives_the_plugins_fp8_index_caches_and_breaks_nothing(
    reliability_matrix, upstream_runs, matrix_size
):
    tally, unexplained = _compare(
        reliability_matrix, upstream_runs["pr1"], "pr1", matrix_size
    )
    assert not unexplained, json.dumps(unexplained[:10], indent=1)
    assert tally["pr1_keeps_the_stock_description"] > 50, tally
    _shown(tally, "pr1", matrix_size)
    print(json.dumps(tally, indent=1))


def test_pr1_and_pr2_start_the_plugins_uniform_pools(
    reliability_matrix, upstream_runs, matrix_size
):
    tally, unexplained = _compare(
        reliability_matrix, upstream_runs["pr1_pr2"], "pr1_pr2", matrix_size
    )
    assert not unexplained, json.dumps(unexplained[:10], indent=1)
    assert tally["same uniform"] > 50 and tally["non_breaking"] > 100, tally
    _shown(tally, "pr1_pr2", matrix_size)
    print(json.dumps(tally, indent=1))


def test_the_plugin_on_a_pr1_vllm_keeps_its_own_outcome(
    reliability_matrix, upstream_runs
):
    """Both installed during the move: vLLM's PR 1 hook runs first, the
    plugin's stricter one after it, and every cell ends as with the plugin on
    stock vLLM (but for the dtype PR 1 sets where no index cache exists)."""
    for platform, run in upstream_runs["with_plugin"].items():
        plugin = {r["id"]: r["class"] for r in reliability_matrix[platform]["plugin"]}
        cells = {cell.id: cell for cell in equivalence.equivalence_cells(platform)}
        differ = [
            (record["id"], plugin[record["id"]], record["class"])
            for record in run["records"]
            if record["class"] != plugin[record["id"]]
            and equivalence.explain(
                cells[record["id"]], plugin[record["id"]], record["class"], "pr1"
            )
            != "no_index_cache"
        ]
        assert not differ, json.dumps(differ[:10], indent=1)
