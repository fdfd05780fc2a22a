"""The upstream patches pass vLLM's own pre-commit hooks (``precommit.py``):
in vLLM's v0.33.0 source release, each PR applied alone, every hook that
applies to its changed files and runs on a CPU passes; and the hooks are live
here: they fail on the two faults vLLM's review flagged before."""

from __future__ import annotations

import pytest

from tests.upstream import overlay, precommit

SERIES = {"pr1": overlay.PR1, "pr3": overlay.PR3, "pr4": overlay.PR4}
NOT_APPLICABLE: dict[str, set[str]] = {"pr1": set(), "pr3": set(), "pr4": set()}
"""Hooks with no changed file of theirs (each PR now changes a Buildkite file)."""


@pytest.mark.parametrize("series", list(SERIES))
def test_vllm_precommit_hooks_pass_on_the_changed_files(series, tmp_path):
    patches = SERIES[series]
    tree = precommit.patched_tree(tmp_path, patches)
    # The tree is a hard-linked copy of the cached release: what the patches
    # change are private files, and the cache stays read-only.
    pristine = precommit.pristine_source()
    for path in precommit.changed_files(patches):
        if (pristine / path).is_file():
            assert (tree / path).stat().st_ino != (pristine / path).stat().st_ino
            assert not (pristine / path).stat().st_mode & 0o222, path
    results = precommit.run_hooks(tree, precommit.changed_files(patches))
    failed = {r.hook: r.output[-1500:] for r in results if r.returncode}
    assert not failed, failed
    # Every other hook listed applied to some changed file, so each one ran.
    assert {r.hook for r in results} == set(precommit.HOOKS) - NOT_APPLICABLE[series]


def test_the_hooks_catch_an_untethered_test_and_a_forbidden_import(tmp_path):
    # PR 1 without its Buildkite step, and its test importing the stdlib re.
    tree = precommit.patched_tree(tmp_path, overlay.PR1, exclude=(".buildkite/*",))
    test_file = "tests/models/minimax_m3/test_index_cache_dtype.py"
    path = tree / test_file
    path.write_text(
        path.read_text().replace("import pytest\n", "import re\n\nimport pytest\n", 1)
    )
    results = precommit.run_hooks(
        tree, [test_file], ("check-test-tethering", "check-forbidden-imports")
    )
    assert {r.hook: r.returncode != 0 for r in results} == {
        "check-test-tethering": True,
        "check-forbidden-imports": True,
    }, [r.output[-800:] for r in results]


def test_mypy_is_given_only_the_files_each_tree_has(tmp_path):
    """On the stock tree the patches' new test files do not exist; mypy given
    a missing path checks nothing, so every patched-tree error looked added."""
    stock = precommit.patched_tree(tmp_path / "stock", ())
    files = precommit.changed_files(overlay.PATCHES)
    new = "tests/config/test_checkpoint_kv_cache_dtype.py"
    assert new in files and not (stock / new).exists()
    given = precommit.python_files_in(stock, files)
    assert new not in given and "vllm/model_executor/models/config.py" in given
    assert not [f for f in given if not f.endswith(".py")]
