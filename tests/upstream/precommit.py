"""vLLM's own pre-commit hooks, run on the upstream patches' changed files.

vLLM's source release (the v0.33.0 sdist) carries ``.pre-commit-config.yaml``,
the hook scripts in ``tools/pre_commit/`` and the Buildkite pipelines the
test-tethering hook reads; the wheel has none of them. :func:`source_release`
fetches the sdist once (pip finds it on the configured index; its address is
read from pip's own log, then the archive is checked against
``SDIST_SHA256``), :func:`pristine_source` extracts it once,
:func:`patched_tree` makes a hard-linked copy of that and applies patches with
``git apply``, and :func:`run_hooks` runs the hooks that can run on a CPU as
vLLM's config declares them (entry, file filters, ``pass_filenames``), with
ruff and typos at vLLM's pinned versions. The pre-commit framework itself is
not used: it would clone each hook repository.

``python -m tests.upstream.precommit`` prints each hook's result for PR 1,
then for PR 3, each applied alone.
"""

from __future__ import annotations

import hashlib
import os
import re
import shlex
import shutil
import subprocess
import sys
import tarfile
import tempfile
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from tests.upstream import overlay

VERSION = "0.33.0"
SDIST = f"vllm-{VERSION}.tar.gz"
SDIST_SHA256 = "f4c33c2503d52bb411146afa9618a4f48bed68912f617e6803ac8d76e4c74112"
CACHE = overlay.CACHE

HOOKS = (
    "ruff-check",
    "ruff-format",
    "typos",
    "check-spdx-header",
    "check-root-lazy-imports",
    "check-forbidden-imports",
    "check-torch-cuda-call",
    "check-boolean-context-manager",
    "check-trust-remote-code",
    "validate-config",
    "check-buildkite-step-keys",
    "check-test-tethering",
)
"""The hooks run here: every one that applies to these files and runs on a CPU."""

NOT_RUN = {
    "mypy": "not in the test run: vLLM's hook with its pinned dependencies "
    "takes about 4.5 minutes per tree on two cores. `python -m "
    "tests.upstream.precommit --mypy` runs it on the patched and the stock "
    "tree and lists only the errors the patches add (2026-12-02, PR 1 and PR "
    "3: none; 9 on stock v0.33.0 in the changed files, about 3 minutes)",
    "markdownlint-cli2, shellcheck, actionlint, clang-format, pip-compile": (
        "no changed file of their types"
    ),
    "signoff-commit": "a commit-msg hook: sign the commit with git commit -s",
}

PINNED_TOOLS = {"ruff-check": "ruff", "ruff-format": "ruff", "typos": "typos"}
"""Hooks run by a pinned tool from its own repository; the rest are local."""
TOOL_FILE_TYPES = {"ruff-check": ["python", "pyi"], "ruff-format": ["python", "pyi"]}
"""What the tools' own hook manifests declare (vLLM's config does not repeat it)."""


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _sdist_address() -> str:
    # pip resolves the source release, then stops building its metadata (it
    # needs build tools this environment lacks); its verbose log names the
    # archive it found.
    with tempfile.TemporaryDirectory() as scratch:
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "-vv",
                "--no-deps",
                "--no-binary",
                ":all:",
                "--no-build-isolation",
                "--dest",
                scratch,
                f"vllm=={VERSION}",
            ],
            capture_output=True,
            text=True,
            timeout=600,
        )
    found = re.search(rf"https?://\S+/{re.escape(SDIST)}", proc.stdout + proc.stderr)
    if found is None:
        raise RuntimeError(f"pip found no {SDIST} on its index:\n{proc.stderr[-2000:]}")
    return found.group(0)


def source_release() -> Path:
    """vLLM's v0.33.0 source archive, fetched once into ``CACHE``."""
    from filelock import FileLock

    archive = CACHE / SDIST
    if archive.is_file() and _sha256(archive) == SDIST_SHA256:
        return archive
    CACHE.mkdir(parents=True, exist_ok=True)
    # Both xdist workers may ask at once on a fresh machine: one fetches.
    with FileLock(f"{archive}.lock"):
        if archive.is_file() and _sha256(archive) == SDIST_SHA256:
            return archive
        partial = archive.with_suffix(f".part-{os.getpid()}")
        urllib.request.urlretrieve(_sdist_address(), partial)
        if (digest := _sha256(partial)) != SDIST_SHA256:
            partial.unlink()
            raise RuntimeError(f"{SDIST}: sha256 {digest}, expected {SDIST_SHA256}")
        partial.replace(archive)
    return archive


def tool(name: str, version: str) -> Path:
    """A pinned tool's executable, installed once into ``CACHE``."""
    from filelock import FileLock

    target = CACHE / f"{name}-{version}"
    executable = target / "bin" / name
    if executable.is_file():
        return executable
    CACHE.mkdir(parents=True, exist_ok=True)
    with FileLock(f"{target}.lock"):  # one install, whoever asks first
        if executable.is_file():
            return executable
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "install",
                "--quiet",
                "--target",
                str(target),
                f"{name}=={version}",
            ],
            check=True,
            timeout=600,
        )
    return executable


def pristine_source() -> Path:
    """The source release extracted once into ``CACHE``, its files read-only:
    each tree :func:`patched_tree` makes is a hard-linked copy of it (about
    0.6 CPU-s instead of 9.6 for extracting the archive again)."""
    extracted = CACHE / f"vllm-{VERSION}-source-{SDIST_SHA256[:12]}"
    if not (extracted / ".complete").is_file():
        CACHE.mkdir(parents=True, exist_ok=True)
        scratch = Path(tempfile.mkdtemp(prefix=".extracting-", dir=CACHE))
        with tarfile.open(source_release()) as archive:
            archive.extractall(scratch, filter="data")
        for path in scratch.rglob("*"):
            if path.is_file() and not path.is_symlink():
                # A write through a hard link would change every later tree:
                # make it fail instead.
                path.chmod(path.stat().st_mode & ~0o222)
        (scratch / ".complete").write_text(SDIST_SHA256)
        try:
            scratch.rename(extracted)
        except OSError:  # another process finished first
            shutil.rmtree(scratch)
    return extracted / f"vllm-{VERSION}"


def _link_or_copy(source: str, target: str) -> None:
    try:
        os.link(source, target)
    except OSError:  # e.g. the cache on another filesystem
        shutil.copy2(source, target)


def patched_tree(
    workdir: Path, patches: tuple[Path, ...], exclude: tuple[str, ...] = ()
) -> Path:
    """The source release in ``workdir`` with ``patches`` applied in order
    (less the paths matching ``exclude``)."""
    tree = workdir / f"vllm-{VERSION}"
    shutil.copytree(pristine_source(), tree, symlinks=True, copy_function=_link_or_copy)
    for patch in patches:
        for path, exists in overlay.touched_paths(patch).items():
            if exists and (tree / path).is_file():
                # A private, writable copy for git apply (never the cache's).
                linked = tree / path
                content = linked.read_bytes()
                linked.unlink()
                linked.write_bytes(content)
        subprocess.run(
            ["git", "apply", "--whitespace=error-all"]
            + [f"--exclude={pattern}" for pattern in exclude]
            + [str(patch)],
            cwd=tree,
            check=True,
            capture_output=True,
            text=True,
        )
    return tree


def changed_files(patches: tuple[Path, ...]) -> list[str]:
    return sorted({p for patch in patches for p in overlay.touched_paths(patch)})


@dataclass
class HookResult:
    hook: str
    files: list[str]
    returncode: int
    output: str


def _config(tree: Path) -> dict:
    import yaml

    return yaml.safe_load((tree / ".pre-commit-config.yaml").read_text())


def _applies(hook: dict, path: str, exclude: str) -> bool:
    types = set(hook.get("types", [])) | set(hook.get("types_or", []))
    if types and not (types & {"python", "pyi"} and path.endswith((".py", ".pyi"))):
        return False
    if "files" in hook and not re.search(hook["files"], path):
        return False
    return not re.search(exclude, path) and not (
        "exclude" in hook and re.search(hook["exclude"], path)
    )


def run_hooks(
    tree: Path, files: list[str], hooks: tuple[str, ...] = HOOKS
) -> list[HookResult]:
    """Each of ``hooks`` that applies to ``files``, as vLLM's config runs it."""
    config = _config(tree)
    exclude = config.get("exclude", "^$")
    results = []
    for repo in config["repos"]:
        for hook in repo["hooks"]:
            if hook["id"] not in hooks:
                continue
            declared = {"types_or": TOOL_FILE_TYPES.get(hook["id"], []), **hook}
            selected = [f for f in files if _applies(declared, f, exclude)]
            if not selected and not hook.get("always_run"):
                continue
            if hook["id"] in PINNED_TOOLS:
                name = PINNED_TOOLS[hook["id"]]
                executable = tool(name, repo["rev"].removeprefix("v"))
                sub = {"ruff-check": ["check"], "ruff-format": ["format", "--check"]}
                # --fix is for a developer's tree; here the tree must already
                # be clean.
                args = [a for a in hook.get("args", []) if a != "--fix"]
                command = [str(executable), *sub.get(hook["id"], []), *args]
            else:
                entry = shlex.split(hook["entry"])
                if entry[0] == "python":
                    entry[0] = sys.executable
                command = [*entry, *hook.get("args", [])]
            if hook.get("pass_filenames", True):
                command += selected
            proc = subprocess.run(
                command, cwd=tree, capture_output=True, text=True, timeout=600
            )
            results.append(
                HookResult(
                    hook["id"], selected, proc.returncode, proc.stdout + proc.stderr
                )
            )
    return results


MYPY_HOOK = "mypy"


def python_files_in(tree: Path, files: list[str]) -> list[str]:
    """The Python files of ``files`` that ``tree`` has: a stock tree lacks the
    patches' new files, and mypy given a missing path checks nothing at all."""
    return [f for f in files if f.endswith((".py", ".pyi")) and (tree / f).is_file()]


def mypy_errors(tree: Path, files: list[str]) -> set[str]:
    """vLLM's own mypy hook (``tools/pre_commit/mypy.py 3.11``) with the
    dependencies its pre-commit entry pins, installed once into ``CACHE``;
    its errors with line numbers dropped, so two trees compare."""
    hook = next(
        h
        for repo in _config(tree)["repos"]
        for h in repo["hooks"]
        if h["id"] == MYPY_HOOK
    )
    target = CACHE / "mypy-hook"
    if not (target / "bin" / "mypy").is_file():
        subprocess.run(
            [sys.executable, "-m", "pip", "install", "--quiet", "--target", str(target)]
            + hook["additional_dependencies"],
            check=True,
            timeout=900,
        )
    python_files = python_files_in(tree, files)
    env = {
        **os.environ,
        "PATH": f"{target / 'bin'}:{os.environ['PATH']}",
        "PYTHONPATH": str(target),
    }
    entry = shlex.split(hook["entry"])
    proc = subprocess.run(
        [sys.executable, *entry[1:], *python_files],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    return {
        re.sub(r":\d+: error:", ": error:", line)
        for line in proc.stdout.splitlines()
        if ": error:" in line
    }


def main() -> None:
    if "--mypy" in sys.argv[1:]:
        with tempfile.TemporaryDirectory() as workdir:
            files = changed_files(overlay.PATCHES)
            stock = mypy_errors(patched_tree(Path(workdir, "stock"), ()), files)
            patched = patched_tree(Path(workdir, "patched"), overlay.PATCHES)
            added = mypy_errors(patched, files) - stock
        print(f"mypy: {len(stock)} errors on stock v0.33.0 in these files;")
        print(f"errors the patches add: {len(added)}", *sorted(added), sep="\n  ")
        sys.exit(1 if added else 0)
    for title, patches in (
        ("PR 1", overlay.PR1),
        ("PR 3", overlay.PR3),
        ("PR 4", overlay.PR4),
    ):
        with tempfile.TemporaryDirectory() as workdir:
            tree = patched_tree(Path(workdir), patches)
            print(f"{title}:")
            for result in run_hooks(tree, changed_files(patches)):
                status = "passed" if result.returncode == 0 else "FAILED"
                print(f"  {result.hook:32} {status}  ({len(result.files)} files)")
                if result.returncode:
                    print(result.output[-2000:])
    print("not run:", *(f"{k}: {v}" for k, v in NOT_RUN.items()), sep="\n  ")


if __name__ == "__main__":
    main()
