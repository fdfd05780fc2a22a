"""The upstream patches (``upstream/``): each applies alone to the installed
vLLM 0.33, their own tests pass there (on simulated GPUs) with expectations
fixed per CI step, and fail on stock vLLM; PR 1 stays within its line budget;
and without the plugin the series reaches the plugin's index-cache dtype on
every fp8 cell of the reliability matrix wherever the plugin starts a uniform
pool (PR 1 + PR 3 on the checkpoint-KV cells too), except the declared
differences in ``equivalence.py``.
"""

from __future__ import annotations

import ast
import collections
import json
import re
from pathlib import Path

import pytest

from tests.reliability.matrix import RULE_WITNESSES, matches
from tests.upstream import equivalence, overlay
from tests.upstream.report import PLATFORMS_BY_SERIES, run_patched
from vllm_minimax_m3_kv_sim.plumbing.children import json_from_out_file, run_python

SERIES = {
    "pr1": overlay.PR1,
    "pr3": overlay.PR3,
    "pr4": overlay.PR4,
    "pr1_pr3": overlay.PR1_PR3,
}


@pytest.fixture(scope="module")
def pr1(tmp_path_factory) -> overlay.Overlay:
    return overlay.build(tmp_path_factory.mktemp("pr1"), overlay.PR1)


@pytest.fixture(scope="module")
def pr3(tmp_path_factory) -> overlay.Overlay:
    return overlay.build(tmp_path_factory.mktemp("pr3"), overlay.PR3)


@pytest.fixture(scope="module")
def pr1_pr3(tmp_path_factory) -> overlay.Overlay:
    return overlay.build(tmp_path_factory.mktemp("pr1_pr3"), overlay.PR1_PR3)


@pytest.fixture(scope="module")
def pr4(tmp_path_factory) -> overlay.Overlay:
    return overlay.build(tmp_path_factory.mktemp("pr4"), overlay.PR4)


@pytest.fixture(scope="module")
def series_all(tmp_path_factory) -> overlay.Overlay:
    return overlay.build(tmp_path_factory.mktemp("all"), overlay.PATCHES)


def test_each_patch_applies_alone_and_changes_only_copies(
    pr1, pr3, pr4, pr1_pr3, series_all, tmp_path
):
    installed = overlay.installed_vllm()
    assert [p.name[:3] for p in overlay.PATCHES] == ["01-", "03-", "04-"]
    alone = (pr1, pr3, pr4)
    for patched in (*alone, pr1_pr3, series_all):
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
    # The series applies in any order: where two PRs share a file (round 5:
    # PR 1's MSA helper and PR 4's fp8 gate, both in common/indexer.py),
    # their hunks stand apart, so each order applies and changes both.
    for index, first in enumerate(alone):
        for second in alone[index + 1 :]:
            shared = set(first.patched) & set(second.patched)
            if not shared:
                continue
            assert shared == {"vllm/models/minimax_m3/common/indexer.py"}
            for order in ((first, second), (second, first)):
                patches = tuple(p for o in order for p in o.patches)
                both = overlay.build(tmp_path / "-".join(p.name[:2] for p in patches),
                                     patches)  # fmt: skip
                for path in shared:
                    text = (both.root / path).read_text()
                    assert "uses_sm100_msa_indexer" in text  # PR 1's
                    assert "fp8_index_cache_supported" in text  # PR 4's
    assert set(pr1_pr3.patched) == set(pr1.patched) | set(pr3.patched)
    assert set(series_all.patched) == {p for o in alone for p in o.patched}


def _added_lines(patch: Path, under: str) -> list[str]:
    added, current = [], ""
    for line in patch.read_text().splitlines():
        if line.startswith("+++ b/"):
            current = line.removeprefix("+++ b/")
        elif line.startswith("+") and current.startswith(under):
            added.append(line[1:])
    return added


def _docstring_lines(source: str) -> set[int]:
    """Lines of string-only statements: module, class, function and
    attribute docstrings."""
    return {
        number
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Expr)
        and isinstance(node.value, ast.Constant)
        and isinstance(node.value.value, str)
        for number in range(node.lineno, node.end_lineno + 1)
    }


def code_lines(patch: Path, tree: Path, under: str = "vllm/") -> list[str]:
    """Lines ``patch`` adds under ``under`` in the patched ``tree``, less
    comments, blank lines and docstrings."""
    code = []
    for path, numbers in overlay.added_line_numbers(patch).items():
        if not path.startswith(under):
            continue
        source = (tree / path).read_text()
        lines = source.splitlines()
        docstrings = _docstring_lines(source)
        for number in sorted(numbers - docstrings):
            text = lines[number - 1].strip()
            if text and not text.startswith("#"):
                code.append(text)
    return code


PR_CODE_BUDGET = {"01-": 55, "03-": 25, "04-": 20}
"""Code lines each PR may add under vllm/ (issue #31: PR 1 about 40). Round 4
(issue #41): PR 1 moved the aiter-kernel check into the ROCm gate and scoped
the hook (47); PR 3 became a per-layer helper asked at three sites (21).
Round 5 (issue #52): PR 1's CUDA branch asks model build's own MSA condition
through a helper both share (53); PR 4's MTP check defers fp8 to the
selection the draft layers make (13). Round 6 (issue #66): PR 4's drafter
message made true (16)."""


@pytest.mark.parametrize("patch", overlay.PATCHES, ids=lambda p: p.name[:2])
def test_no_patch_adds_an_error_or_grows_past_its_budget(patch, tmp_path):
    """No PR refuses what stock vLLM 0.33 starts: no added line under vllm/
    raises. Each stays within its budget of code lines, counted in a tree with
    that patch alone (its line numbers are the stock file's plus its own)."""
    added = _added_lines(patch, "vllm/")
    assert not [line for line in added if "raise " in line], patch.name
    code = code_lines(patch, overlay.build(tmp_path, (patch,)).root)
    assert 0 < len(code) <= PR_CODE_BUDGET[patch.name[:3]], code


def test_the_budget_counts_code_not_docstrings_or_comments(tmp_path):
    source = 'def f():\n    """One\n    line."""\n    # why\n\n    return 1\n'
    (tmp_path / "vllm").mkdir()
    (tmp_path / "vllm" / "f.py").write_text(source)
    patch = tmp_path / "f.patch"
    body = "".join(f"+{line}\n" for line in source.splitlines())
    patch.write_text(
        "diff --git a/vllm/f.py b/vllm/f.py\n--- /dev/null\n+++ b/vllm/f.py\n"
        f"@@ -0,0 +1,6 @@\n{body}"
    )
    assert code_lines(patch, tmp_path) == ["def f():", "return 1"]


GATES_UNDER_TEST = (
    "fp8_index_cache_supported",
    "msa_indexer_unsupported_reason",
    "select_msa_indexer_impl_cls",
    "select_indexer_impl_cls",
    "_minimax_m3_aiter_sparse_pa_requested",
    "supports_fp8",
    "on_gfx950",
    "is_device_capability",
    "has_device_capability",
)
"""What PR 1's hook asks, directly or through model build's gate."""


def test_pr1s_tests_fix_their_expectations_instead_of_asking_the_gate():
    """A test that recomputes "fp8 or not" from the predicates the hook calls
    passes whether or not the default applies (review of round 2). PR 1's
    tests name none of them: every expectation is a literal per CI step."""
    for patch in overlay.PR1:
        tests = "\n".join(_added_lines(patch, "tests/models/"))
        assert tests, patch.name
        assert [gate for gate in GATES_UNDER_TEST if gate in tests] == []


# Simulated GPUs each PR's own tests run on (one process each), as its CI
# steps run them: PR 1 in the B200 step and the MI355 step (with the AITER
# variables it sets), PR 3 in vLLM's CPU config step (here on B200: this
# machine's vLLM is the CUDA wheel) and the B200 MiniMax-M3 step (its layer
# test; on MI355X too, for the ROCm model's hunk).
OWN_TEST_HARDWARE = {
    "pr1": [
        {"SIM_HARDWARE": "b200"},
        {
            "SIM_HARDWARE": "mi355x",
            "VLLM_ROCM_USE_AITER": "1",
            "VLLM_ROCM_SHUFFLE_KV_CACHE_LAYOUT": "1",
        },
    ],
    "pr3": [{"SIM_HARDWARE": "b200"}, {"SIM_HARDWARE": "mi355x"}],
    # The MI355 Miscellaneous Kernels step (no AITER variables).
    "pr4": [{"SIM_HARDWARE": "mi355x"}],
}
OWN_TESTS_PASSED = {
    # Each case under both published architectures; the ROCm-only cases and
    # the two GPU tests skip on B200, the GPU tests on MI355X.
    ("pr1", "b200"): (15, 8),
    ("pr1", "mi355x"): (19, 4),
    ("pr3", "b200"): (7, 0),
    ("pr3", "mi355x"): (7, 0),
    # The kernel cases (6 decode shapes, 2 prefill, CUDA's mixed pair) need a
    # GPU; the selection and MTP-drafter build cases run.
    ("pr4", "mi355x"): (2, 9),
}
"""(passed, skipped) per series and simulated GPU."""
FAILS_ON_STOCK = {
    "pr1": {
        "test_auto_follows_an_fp8_kv_cache",
        "test_the_mtp_drafter_gets_the_same_index_cache",
    },
    # The layer test; the config module does not import (its helper is new).
    "pr3": {"test_sparse_layer_applies_the_checkpoints_kv_cache_scheme"},
    "pr4": {
        "test_rocm_gfx950_selects_the_triton_indexer_for_an_fp8_index_cache",
        "test_rocm_gfx950_mtp_drafter_builds_the_triton_indexer_on_fp8",
    },
}
FAILS_ON_STOCK_WITH = {
    "pr1": "AssertionError",
    "pr3": "ImportError: cannot import name 'layer_kv_cache_dtype'",
    # Stock model build refuses it: the gate the PR relaxes.
    "pr4": "NotImplementedError: indexer_kv_dtype='fp8' requires CUDA fp8 support.",
}


@pytest.fixture(scope="module")
def vllm_source() -> Path:
    from tests.upstream import precommit

    return precommit.pristine_source()


def _pytest_in_child(
    series: str, patched: overlay.Overlay, source: Path, env: dict[str, str]
) -> tuple[int, str]:
    """The patches' tests, run as vLLM's CI runs them: from vLLM's ``tests/``
    (its source release's, here), under its real ``conftest.py``, against the
    installed vLLM (or the overlay on ``PYTHONPATH``)."""
    tests = overlay.vllm_test_tree(patched, source)
    assert (tests / "conftest.py").resolve() == source / "tests" / "conftest.py"
    proc = run_python(
        [
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-p",
            "vllm_minimax_m3_kv_sim.plumbing.pytest_hardware",
            # Each failure's assertion, without vLLM's captured log lines.
            "--tb=short",
            "--show-capture=no",
            # On stock, PR 3's config module does not import; its layer test
            # still runs.
            "--continue-on-collection-errors",
            *overlay.test_files(patched.patches, tests),
        ],
        env,
        timeout=600,
        cwd=tests,
    )
    return proc.returncode, proc.stdout[-3000:] + proc.stderr[-3000:]


def _counts(output: str) -> tuple[int, int]:
    passed = re.search(r"(\d+) passed", output)
    skipped = re.search(r"(\d+) skipped", output)
    return (
        int(passed.group(1)) if passed else 0,
        int(skipped.group(1)) if skipped else 0,
    )


@pytest.mark.parametrize("series", ["pr1", "pr3", "pr4"])
def test_patch_unit_tests_pass_on_the_patched_vllm(series, request, vllm_source):
    patched = request.getfixturevalue(series)
    for hardware in OWN_TEST_HARDWARE[series]:
        env = {**overlay.child_env(patched), **hardware}
        returncode, output = _pytest_in_child(series, patched, vllm_source, env)
        assert returncode == 0, (hardware, output)
        expected = OWN_TESTS_PASSED[series, hardware["SIM_HARDWARE"]]
        assert _counts(output) == expected, output


@pytest.mark.parametrize("series", ["pr1", "pr3", "pr4"])
def test_patch_unit_tests_fail_on_stock_vllm(series, request, vllm_source):
    """They test the patches, not vLLM: on stock 0.33, on every simulated GPU
    of the PR's CI steps, exactly the tests of the change fail, each on its
    assertion (the rest describe what 0.33 already does)."""
    patched = request.getfixturevalue(series)
    for hardware in OWN_TEST_HARDWARE[series]:
        stock = {**overlay.child_env(patched), **hardware, "PYTHONPATH": ""}
        del stock["VLLM_CACHE_ROOT"]  # stock vLLM's own
        returncode, output = _pytest_in_child(series, patched, vllm_source, stock)
        failed = {re.sub(r"\[.*", "", name) for name in _failed(output)}
        assert returncode != 0 and failed == FAILS_ON_STOCK[series], (hardware, output)
        # Failed on their assertions (or, for PR 4, on the gate it relaxes),
        # not on an import the patch adds (vLLM's own log lines name the CUDA
        # extensions it could not load).
        assert FAILS_ON_STOCK_WITH[series] in output, output
        if "ImportError" not in FAILS_ON_STOCK_WITH[series]:
            assert not re.search(r"^E\s+\w*(Import|NotFound)Error", output, re.M)


def _failed(output: str) -> list[str]:
    return re.findall(r"FAILED \S+::(\S+)", output)


def _without(patch: Path, prefix: str) -> str:
    """``patch`` less its diffs of the files under ``prefix``."""
    sections = re.split(r"(?m)^(?=diff --git )", patch.read_text(encoding="utf-8"))
    return "".join(s for s in sections if not s.startswith(f"diff --git a/{prefix}"))


WITHOUT_THE_MODEL_HUNKS = {
    # Round 4's PR 3 test asked the helper alone and passed with the
    # MiniMax-M3 hunks reverted; the layer test sees them.
    "pr3": (
        "vllm/models/minimax_m3/",
        "b200",
        "test_sparse_layer_applies_the_checkpoints_kv_cache_scheme",
        "assert 'auto' == 'fp8'",
    ),
    # Round 4's PR 4 had no test for its MTP hunk.
    "pr4": (
        "vllm/models/minimax_m3/amd/mtp.py",
        "mi355x",
        "test_rocm_gfx950_mtp_drafter_builds_the_triton_indexer_on_fp8",
        "NotImplementedError: MiniMax M3 MTP could not select the MSA indexer",
    ),
}


@pytest.mark.parametrize("series", sorted(WITHOUT_THE_MODEL_HUNKS))
def test_each_model_hunk_has_a_test_that_fails_without_it(
    series, tmp_path, vllm_source
):
    """With the rest of the PR applied and these model files as on 0.33,
    exactly the test of those hunks fails, on what they change."""
    prefix, hardware, test, error = WITHOUT_THE_MODEL_HUNKS[series]
    (patch,) = SERIES[series]
    partial = tmp_path / patch.name
    partial.write_text(_without(patch, prefix), encoding="utf-8")
    assert any(path.startswith(prefix) for path in overlay.touched_paths(patch))
    assert not any(p.startswith(prefix) for p in overlay.touched_paths(partial))
    patched = overlay.build(tmp_path / "tree", (partial,))
    env = {**overlay.child_env(patched), "SIM_HARDWARE": hardware}
    returncode, output = _pytest_in_child(series, patched, vllm_source, env)
    failed = {re.sub(r"\[.*", "", name) for name in _failed(output)}
    assert returncode != 0 and failed == {test}, output
    assert error in output, output


@pytest.fixture(scope="module")
def upstream_runs(pr1, pr1_pr3, matrix_size) -> dict[str, dict[str, dict]]:
    """The equivalence cells on a patched vLLM, per platform: PR 1 alone and
    PR 1 + PR 3 (plugin excluded), and PR 1 with the plugin installed too."""
    platforms = {k: v[matrix_size] for k, v in PLATFORMS_BY_SERIES.items()}
    return {
        "pr1": run_patched(pr1, platforms["pr1"], size=matrix_size),
        "pr1_pr3": run_patched(
            pr1_pr3, platforms["pr1_pr3"], size=matrix_size, series="pr1_pr3"
        ),
        "with_plugin": run_patched(
            pr1, platforms["with_plugin"], with_plugin=True, size=matrix_size
        ),
    }


# What the plugin still does on a vLLM carrying PR 1: everything; its strict
# config hook stacks after vLLM's own.
ON_PR1 = [
    "minimax_m3_config_hook",
    "minimax_m3_indexer_cache_storage",
    "minimax_m3_rocm_fp8_triton_indexer",
    "minimax_m3_rocm_fnuz_index_writer",
    "minimax_m3_rocm_fp8_balanced_decode",
    "minimax_m3_kv_zeroing_decision",
    "minimax_m3_kv_allow_mixed_env",
]


def test_children_ran_the_patched_vllm(pr1, pr1_pr3, upstream_runs):
    for kind, patched, registered, applied in (
        ("pr1", pr1, None, []),
        ("pr1_pr3", pr1_pr3, None, []),
        ("with_plugin", pr1, True, ON_PR1),
    ):
        for platform, run in upstream_runs[kind].items():
            assert Path(run["vllm"]).is_relative_to(patched.root), platform
            assert run["plugin_registered"] is registered, (kind, platform)
            assert run["plugin_applied"] == applied, (kind, platform)


@pytest.mark.parametrize("series", ["pr1", "pr1_pr3"])
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
        {"argv": ["--target", "mi250x", "--kv-cache-dtype", "fp8", "-tp", "8"]},
        {"argv": ["--target", "b300", "--kv-cache-dtype", "fp8", "-tp", "3"]},
    ]
    cases_file = tmp_path / "cases.json"
    cases_file.write_text(json.dumps(cases))
    env = overlay.child_env(patched)
    del env["VLLM_PLUGINS"]
    argv = ["-m", "vllm_minimax_m3_kv_sim.programs.check_batch", str(cases_file)]
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
        if series in difference.upstream:
            assert tally[difference.name] > 0, (difference.name, tally)


def test_pr1_gives_the_plugins_fp8_index_caches_and_breaks_nothing(
    reliability_matrix, upstream_runs, matrix_size
):
    tally, unexplained = _compare(
        reliability_matrix, upstream_runs["pr1"], "pr1", matrix_size
    )
    assert not unexplained, json.dumps(unexplained[:10], indent=1)
    assert tally["described_as_in_0_33"] > 50, tally
    _shown(tally, "pr1", matrix_size)
    print(json.dumps(tally, indent=1))


def test_pr1_on_pr3_ends_every_checkpoint_kv_cell_as_declared(
    reliability_matrix, upstream_runs, matrix_size
):
    tally, unexplained = _compare(
        reliability_matrix, upstream_runs["pr1_pr3"], "pr1_pr3", matrix_size
    )
    assert not unexplained, json.dumps(unexplained[:10], indent=1)
    _shown(tally, "pr1_pr3", matrix_size)
    # The checkpoint-KV cells the plugin starts uniform with an fp8 index
    # cache: where the config says fp8 (modelopt, or an explicit flag), PR 1
    # on PR 3 builds the same fp8 index cache; a compressed-tensors scheme
    # under --kv-cache-dtype auto reaches the layers, not the config hooks.
    checkpoint_cells = _checkpoint_kv_agreement(
        reliability_matrix, upstream_runs["pr1_pr3"], matrix_size
    )
    assert checkpoint_cells["fp8 index cache, as the plugin"] > 0, checkpoint_cells
    assert checkpoint_cells["declared: scheme_resolved_per_layer"] > 0
    assert checkpoint_cells["other"] == 0, checkpoint_cells
    print(json.dumps(tally, indent=1), json.dumps(checkpoint_cells, indent=1))


def _checkpoint_kv_agreement(
    reliability_matrix: dict, runs: dict[str, dict], size: str
) -> collections.Counter[str]:
    """Checkpoint-KV cells the plugin starts with an fp8 index cache, by what
    PR 1 + PR 3 built there."""
    counts: collections.Counter[str] = collections.Counter()
    for platform, run in runs.items():
        plugin = {r["id"]: r["class"] for r in reliability_matrix[platform]["plugin"]}
        cells = {
            cell.id: cell
            for cell in equivalence.equivalence_cells(platform, size, "pr1_pr3")
        }
        for record in run["records"]:
            cell = cells[record["id"]]
            if cell.checkpoint not in equivalence.matrix.CHECKPOINT_KV:
                continue
            if not plugin[record["id"]].startswith("uniform/indexer=fp8"):
                continue
            if equivalence.INDEX_CACHE_FP8_AS_IN_0_33 in record["precisions"]:
                counts["fp8 index cache, as the plugin"] += 1
                continue
            declared = equivalence.explain(
                cell,
                plugin[record["id"]],
                record["class"],
                "pr1_pr3",
                record.get("precisions"),
            )
            if declared in ("rocm_triton_fp8_indexer", "scheme_resolved_per_layer"):
                counts[f"declared: {declared}"] += 1
            else:
                counts["other"] += 1
    return counts


@pytest.mark.parametrize("series", ["pr1", "pr1_pr3"])
def test_where_the_default_applies_model_build_runs_it(
    series, upstream_runs, matrix_size
):
    """The hook and model build ask one predicate: in every cell where PR 1
    turned an unset or "auto" index cache into fp8, vLLM built the model and
    planned the pool (no model-build, planning or MSA-kernel error)."""
    applied, failed = 0, []
    for platform, run in upstream_runs[series].items():
        cells = {
            cell.id: cell
            for cell in equivalence.equivalence_cells(platform, matrix_size, series)
        }
        for record in run["records"]:
            asked = cells[record["id"]].indexer_kv_dtype
            if asked not in (None, "auto") or record["indexer_kv_dtype"] != "fp8":
                continue
            applied += 1
            if record["class"].startswith(
                ("build_error", "plan_error", "msa_kernels_missing")
            ):
                failed.append((record["id"], record["class"]))
    assert applied > 20 and not failed, (applied, failed[:10])


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


def _function(path: Path, qualname: str) -> ast.AST:
    """The definition of ``qualname`` (``Class.method`` or ``function``)."""
    scope: ast.AST = ast.parse(path.read_text())
    for name in qualname.split("."):
        scope = next(
            node
            for node in ast.iter_child_nodes(scope)
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node.name == name
        )
    return scope


def _called(node: ast.AST) -> set[str]:
    return {
        call.func.id if isinstance(call.func, ast.Name) else call.func.attr
        for call in ast.walk(node)
        if isinstance(call, ast.Call)
        and isinstance(call.func, (ast.Name, ast.Attribute))
    }


def test_pr1_leaves_model_builds_gate_alone_and_asks_the_msa_selections_own(pr1):
    """Review of round 3: model build's fp8 gate (``select_indexer_impl_cls``)
    is 0.33's, and on ROCm the hook asks the one function the ROCm model's MSA
    selection asks, which also checks that aiter ships the MSA kernels. Review
    of round 4: on CUDA it asks model build's own MSA condition too, the one
    ``select_indexer_impl_cls`` now reads from a shared helper."""
    installed = overlay.installed_vllm()
    common = "vllm/models/minimax_m3/common/indexer.py"
    stock = ast.unparse(_function(installed / common.removeprefix("vllm/"),
                                  "select_indexer_impl_cls"))  # fmt: skip
    patched = ast.unparse(_function(pr1.root / common, "select_indexer_impl_cls"))
    # The one change: the MSA width check, asked through the helper.
    assert "is_sm100 and topk_blocks == 16 and" in stock
    assert patched == stock.replace(
        "is_sm100 and topk_blocks == 16 and",
        "is_sm100 and uses_sm100_msa_indexer(topk_blocks) and",
    )
    helper = _function(pr1.root / common, "uses_sm100_msa_indexer")
    assert {"is_cuda", "is_device_capability_family"} <= _called(helper)
    msa = pr1.root / "vllm/models/minimax_m3/amd/indexer_msa.py"
    hook = _function(
        pr1.root / "vllm/model_executor/models/config.py",
        "MiniMaxM3SparseForCausalLMConfig.verify_and_update_config",
    )
    selection = _function(msa, "select_msa_indexer_impl_cls")
    gate = "msa_indexer_unsupported_reason"
    assert gate in _called(hook) and gate in _called(selection)
    assert "uses_sm100_msa_indexer" in _called(hook)
    assert "is_device_capability_family" not in _called(hook)
    assert "_aiter_has_msa_kernels" in _called(_function(msa, gate))
    assert "find_spec" not in _called(hook)
    # The published VL architecture's hook is the same one.
    config = (pr1.root / "vllm/model_executor/models/config.py").read_text()
    assert (
        "class MiniMaxM3SparseForConditionalGenerationConfig"
        "(MiniMaxM3SparseForCausalLMConfig):" in config
    )


PR1_SCOPE = {
    # simulated GPU (and ROCm AITER sparse PA on?) -> (PR text's row, after)
    ("a100", True): ("SM80", "bf16"),
    ("l40s", True): ("SM89", "bf16"),
    ("h200", True): ("SM90", "bf16"),
    ("b200", True): ("B200 (SM100), B300 (SM103), at `sparse_topk_blocks` 16", "fp8"),
    ("b300", True): ("B200 (SM100), B300 (SM103), at `sparse_topk_blocks` 16", "fp8"),
    # Round 5: the hook asks model build's MSA condition, which needs 16.
    ("b200", True, 32): ("at any other `sparse_topk_blocks`", "bf16"),
    ("rtx-pro-6000", True): ("SM120", "bf16"),
    ("mi355x", True): ("gfx950 with the AITER", "fp8"),
    ("mi355x", False): ("gfx950 without", "bf16"),
    ("mi300x", True): ("gfx942", "bf16"),
}
"""Review of round 3: ``supports_fp8()`` took SM89 and SM12x too. PR 1's
default is SM10x and gfx950 with the AITER MSA indexer, and its text says so."""


def _pr1_text_rows() -> dict[str, str]:
    text = overlay.PR1[0].with_suffix(".md").read_text()
    rows = re.findall(r"^\| (.+?) \| (.+?) \| (.+?) \|$", text, re.M)
    return {first: after for first, _before, after in rows}


def test_pr1s_default_applies_where_its_text_says_and_nowhere_else(pr1):
    rows = _pr1_text_rows()
    env = overlay.child_env(pr1)
    for (platform, aiter_sparse_pa, *topk), (row, after) in PR1_SCOPE.items():
        argv = ["-m", "tests.upstream.pr1_scope", "--platform", platform]
        argv += [f"--topk-blocks={topk[0]}"] if topk else []
        resolved = json_from_out_file(
            argv if aiter_sparse_pa else [*argv, "--no-aiter"], env
        )
        assert {"auto": "bf16"}.get(resolved, resolved) == after, platform
        (said,) = [text for first, text in rows.items() if row in first]
        assert said.strip("*").startswith(after), (row, said)
