"""The upstream patches applied to a copy of the installed vLLM, never to vLLM itself.

:func:`build` copies the files a series of patches modifies out of the
installed ``vllm`` package, runs ``git apply`` on those copies in order (the
wheel's Python sources are vLLM v0.33.0's, so this is the check that they
apply), and assembles an overlay: a ``vllm/`` tree of symlinks into the
installed package, with real directories only along the paths to patched
files. A child process with the overlay first on ``PYTHONPATH`` imports the
patched vLLM; the installed package is only read. The patches' ``tests/``
files land beside the overlay; :func:`vllm_test_tree` puts them in vLLM's own
``tests/`` (from its source release) to run under vLLM's real conftest. Their
CI wiring (``.buildkite/``) is checked against that release in
``precommit.py``, not here.
"""

from __future__ import annotations

import ast
import collections
import hashlib
import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from vllm_minimax_m3_kv._versions import vllm_source_root

REPO = Path(__file__).resolve().parents[2]
PATCHES = tuple(sorted((REPO / "upstream").glob("[0-9][0-9]-*.patch")))
"""Every pull request: PR 1 (the index-cache default), PR 3 (the checkpoint's
KV cache dtype at config time) and PR 4 (an fp8 index cache on gfx950's Triton
indexer). Each applies alone to v0.33.0; their vllm/ files are disjoint, so
the series applies in any order. (PR 2 is retired and its number not reused:
docs/upstream.md.)"""
PR1 = tuple(p for p in PATCHES if p.name.startswith("01-"))
PR3 = tuple(p for p in PATCHES if p.name.startswith("03-"))
PR4 = tuple(p for p in PATCHES if p.name.startswith("04-"))
PR1_PR3 = PR1 + PR3
"""The default with the checkpoint's KV dtype resolved at config time: the
series the equivalence run compares with the plugin on checkpoint-KV cells."""
CACHE = (
    Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    / "vllm-minimax-m3-kv"
)
"""What the tests keep between runs: vLLM's source release, pinned tools,
and the patched vLLMs' own ``VLLM_CACHE_ROOT``."""


def installed_vllm() -> Path:
    """The installed ``vllm`` package directory, found without importing it."""
    root = vllm_source_root()
    if root is None:
        raise RuntimeError("vLLM is not installed")
    return root


def touched_paths(patch: Path) -> dict[str, bool]:
    """Repository paths the patch writes -> whether the file exists before it."""
    touched: dict[str, bool] = {}
    current = None
    for line in patch.read_text(encoding="utf-8").splitlines():
        if match := re.match(r"diff --git a/(\S+) b/(\S+)$", line):
            current = match.group(2)
            touched[current] = True
        elif line.startswith("new file mode") and current is not None:
            touched[current] = False
    return touched


@dataclass(frozen=True)
class Overlay:
    root: Path
    """Put first on ``PYTHONPATH``: holds the patched ``vllm`` package."""
    tests: Path
    """The patch's ``tests/`` files."""
    patched: tuple[str, ...]
    """The ``vllm/...`` files that differ from the installed package."""
    patches: tuple[Path, ...] = ()
    """The patches applied, in order."""


IN_THE_WHEEL = ("vllm/", "tests/")
"""What a wheel-based overlay can take; the rest (CI wiring) needs the sdist."""


def _apply(patches: tuple[Path, ...], tree: Path, vllm_root: Path) -> None:
    for patch in patches:
        for path, exists in touched_paths(patch).items():
            target = tree / path
            if exists and path.startswith("vllm/") and not target.exists():
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(vllm_root / path.removeprefix("vllm/"), target)
        # The wheel has vllm/ only: a patch's new tests/ files land beside the
        # overlay; what it changes elsewhere (CI wiring, eval lists) needs the
        # source release (precommit.py).
        excludes = [
            f"--exclude={path}"
            for path, exists in touched_paths(patch).items()
            if not path.startswith("vllm/")
            and (exists or not path.startswith(IN_THE_WHEEL))
        ]
        for args in (("--check",), ()):
            # Outside a git repository, git apply patches the files in cwd.
            subprocess.run(
                [
                    "git",
                    "apply",
                    *args,
                    *excludes,
                    "--whitespace=error-all",
                    str(patch),
                ],
                cwd=tree,
                check=True,
                capture_output=True,
                text=True,
            )


def _link_tree(installed: Path, patched: Path, into: Path) -> None:
    """``into`` mirrors ``installed`` by symlinks, except what ``patched`` has."""
    into.mkdir(parents=True)
    own = {entry.name: entry for entry in patched.iterdir()}
    for entry in installed.iterdir():
        if entry.name == "__pycache__" or entry.name in own:
            continue  # stale bytecode for the patched files stays out
        (into / entry.name).symlink_to(entry, entry.is_dir())
    for name, entry in own.items():
        if entry.is_dir() and (installed / name).is_dir():
            _link_tree(installed / name, entry, into / name)
        elif entry.is_dir():
            shutil.copytree(entry, into / name)
        else:
            shutil.copyfile(entry, into / name)


def build(workdir: Path, patches: tuple[Path, ...] = PATCHES) -> Overlay:
    """Apply ``patches`` in order in ``workdir`` and assemble the overlay there."""
    vllm_root = installed_vllm()
    tree = workdir / "patched"
    tree.mkdir(parents=True)
    _apply(patches, tree, vllm_root)
    root = workdir / "overlay"
    _link_tree(vllm_root, tree / "vllm", root / "vllm")
    patched = tuple(
        sorted(
            {
                p
                for patch in patches
                for p in touched_paths(patch)
                if p.startswith("vllm/")
            }
        )
    )
    return Overlay(
        root=root, tests=tree / "tests", patched=patched, patches=tuple(patches)
    )


def test_files(patches: tuple[Path, ...], tests: Path) -> list[str]:
    """The patches' tests, relative to ``tests/`` (the tree
    :func:`vllm_test_tree` made): a module a patch adds whole; in a module it
    changes, only the tests whose lines it adds or changes (vLLM's own tests
    there are its CI's, and many need a GPU)."""
    selected: list[str] = []
    for patch in patches:
        for path, exists in touched_paths(patch).items():
            if not re.fullmatch(r"tests/.*/test_\w+\.py", path):
                continue
            module = path.removeprefix("tests/")
            if not exists:
                selected.append(module)
                continue
            added = added_line_numbers(patch)[path]
            source = (tests / module).read_text(encoding="utf-8")
            selected += [
                f"{module}::{node.name}"
                for node in ast.parse(source).body
                if isinstance(node, ast.FunctionDef)
                and node.name.startswith("test_")
                and added & set(range(_first_line(node), node.end_lineno + 1))
            ]
    return selected


def _first_line(node: ast.FunctionDef) -> int:
    return min([node.lineno, *(d.lineno for d in node.decorator_list)])


def added_line_numbers(patch: Path) -> dict[str, set[int]]:
    """Per file the patch writes, the line numbers it adds (new file's)."""
    added: dict[str, set[int]] = collections.defaultdict(set)
    current, number = "", 0
    for line in patch.read_text(encoding="utf-8").splitlines():
        if line.startswith("+++ b/"):
            current = line.removeprefix("+++ b/")
        elif hunk := re.match(r"@@ -\S+ \+(\d+)", line):
            number = int(hunk.group(1))
        elif line.startswith("+"):
            added[current].add(number)
            number += 1
        elif not line.startswith(("-", "\\", "diff ", "index ", "new file", "---")):
            number += 1
    return added


def _own_copy(root: Path, path: str, source: Path) -> None:
    """Make ``root/path`` a private copy of ``source/path`` in a tree of links
    into ``source``: each linked directory on the way becomes a real one
    (of links), so nothing is ever written through a link into the release."""
    here = root
    for part in Path(path).parts[:-1]:
        here = here / part
        if here.is_symlink():
            target = here.resolve()
            here.unlink()  # the link itself, in a directory of ours
            here.mkdir()
            for entry in target.iterdir():
                (here / entry.name).symlink_to(entry, entry.is_dir())
    file = root / path
    assert file.is_symlink(), file
    file.unlink()
    shutil.copyfile(source / path, file)


def vllm_test_tree(overlay: Overlay, source: Path) -> Path:
    """vLLM's own ``tests/`` from its source release ``source``, with the
    patches' test files in it (new ones from the overlay, changed ones patched
    on copies), and vLLM's ``pyproject.toml`` (its pytest markers) beside it.
    Run from there, the patches' tests load vLLM's real ``tests/conftest.py``
    and its fixtures, as vLLM's CI runs them from ``/vllm-workspace/tests``;
    the wheel has no ``tests/`` to take them from."""
    root = overlay.tests.parent.parent / "vllm-tests"
    if root.is_dir():  # once per overlay
        return root / "tests"
    overlay.tests.mkdir(parents=True, exist_ok=True)  # a PR may add no test file
    _link_tree(source / "tests", overlay.tests, root / "tests")
    shutil.copyfile(source / "pyproject.toml", root / "pyproject.toml")
    for patch in overlay.patches:
        changed = [
            path
            for path, exists in touched_paths(patch).items()
            if exists and path.startswith("tests/")
        ]
        for path in changed:
            _own_copy(root, path, source)
        if changed:
            includes = [f"--include={path}" for path in changed]
            subprocess.run(
                ["git", "apply", *includes, str(patch)],
                cwd=root,
                check=True,
                capture_output=True,
                text=True,
            )
    return root / "tests"


PATCHED_VLLM_CACHE_ROOT = CACHE / "vllm-cache-patched"
"""Where the patched vLLMs keep their ``VLLM_CACHE_ROOT``s, apart from stock vLLM's.

vLLM's registry caches what it learns about a model class (in a fresh
interpreter, ~15 s) in one file per class, with a hash of the class's package,
and re-learns it when the hash differs. PR 1 changes MiniMax-M3's package, so
one cache shared by stock vLLM and the patched trees would be re-filled at
every switch between them: each patched tree gets a cache root of its own,
named by the content of its patched files (:func:`cache_root`).
"""


def cache_root(overlay: Overlay) -> Path:
    """``VLLM_CACHE_ROOT`` for this patched tree: one per distinct content of
    its patched files, so it is reused across runs and never shared with a
    tree whose model package differs."""
    digest = hashlib.sha256()
    for path in overlay.patched:
        digest.update(path.encode() + b"\0" + (overlay.root / path).read_bytes())
    return PATCHED_VLLM_CACHE_ROOT / digest.hexdigest()[:16]


def child_env(overlay: Overlay) -> dict[str, str]:
    """Environment for a child that runs the patched vLLM without the plugin."""
    from vllm_minimax_m3_kv_sim import REPO as SIM_REPO

    return {
        "PYTHONPATH": f"{overlay.root}:{SIM_REPO}",
        "VLLM_CACHE_ROOT": str(cache_root(overlay)),
        # vLLM loads every general plugin unless told which: name only another.
        "VLLM_PLUGINS": "lora_filesystem_resolver",
        # Imports through the symlinks must not write into the installed package.
        "PYTHONDONTWRITEBYTECODE": "1",
    }
