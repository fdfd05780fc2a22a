"""``vllm-minimax-m3-kv status``: is the plugin installed and loadable here?

Offline, on the node itself: the versions (with a fingerprint of the
installed sources, so two nodes can be compared), the entry point vLLM
discovers, what ``VLLM_PLUGINS`` does to it, whether vLLM's own plugin loader
loads it, and whether ``register()`` would activate on this vLLM. Nothing is
patched and no GPU is touched. Exit 0: vLLM would load it and it would be
active; 1: it would not (each line says why).
"""

from __future__ import annotations

import hashlib
import os
import subprocess
from importlib import metadata, resources
from pathlib import Path

from vllm_minimax_m3_kv._versions import (
    DISTRIBUTION,
    ENTRY_POINT_GROUP,
    PLUGIN_ENTRY_POINT,
    plugin_version,
)


def source_fingerprint() -> str:
    """A hash of the installed package's files: equal on two nodes exactly
    when they run the same plugin code."""
    root = Path(str(resources.files("vllm_minimax_m3_kv")))
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*")):
        if path.suffix in (".py", ".json") and "__pycache__" not in path.parts:
            digest.update(str(path.relative_to(root)).encode() + b"\0")
            digest.update(path.read_bytes())
    return digest.hexdigest()[:12]


def _git(root: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(root), *args],
        capture_output=True,
        text=True,
        check=True,
        timeout=10,
    ).stdout.strip()


def git_commit() -> str | None:
    """The checkout's commit when the package runs from one (editable
    installs), with ``-dirty`` for uncommitted changes; None for a wheel."""
    root = Path(str(resources.files("vllm_minimax_m3_kv"))).parent
    if not (root / ".git").exists():
        return None
    try:
        commit = _git(root, "rev-parse", "--short=12", "HEAD")
        dirty = _git(root, "status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.SubprocessError):
        return None
    return commit + ("-dirty" if dirty else "")


def identity() -> str:
    """``0.1.0 (source 3f2a..., git 1a2b...)``: what ``--version`` prints."""
    commit = git_commit()
    where = f"source {source_fingerprint()}" + (f", git {commit}" if commit else "")
    return f"{plugin_version()} ({where})"


def vllm_loads_this_plugin() -> bool:
    """Whether ``VLLM_PLUGINS`` lets vLLM load this plugin, as vLLM reads it."""
    return _vllm_plugins_effect()[1]


def _vllm_plugins_effect() -> tuple[str, bool]:
    listed = os.environ.get("VLLM_PLUGINS")
    if listed is None:
        return "unset: vLLM loads every general plugin, this one included", True
    names = [name for name in listed.split(",") if name]
    if PLUGIN_ENTRY_POINT in names:
        return f"{listed!r}: lists {PLUGIN_ENTRY_POINT}, so vLLM loads it", True
    return (
        f"{listed!r}: leaves out {PLUGIN_ENTRY_POINT}, so vLLM runs without it "
        f"(add {PLUGIN_ENTRY_POINT} to it, or unset it)",
        False,
    )


def report() -> tuple[list[tuple[str, str]], bool]:
    """The rows and whether the plugin would be loaded and active here."""
    from vllm_minimax_m3_kv._versions import (
        SUPPORTED_VLLM_INSTALL,
        installed_version,
        vllm_version_problem,
    )

    rows = [(DISTRIBUTION, identity())]
    problem = vllm_version_problem()
    vllm = installed_version("vllm") or "not installed"
    rows.append(("vLLM", f"{vllm} ({problem})" if problem else f"{vllm} (supported)"))
    ok = problem is None
    found = [
        ep
        for ep in metadata.entry_points(group=ENTRY_POINT_GROUP)
        if ep.name == PLUGIN_ENTRY_POINT
    ]
    if found:
        rows.append(
            ("entry point", f"{ENTRY_POINT_GROUP}: {found[0].name} -> {found[0].value}")
        )
    else:
        rows.append(
            (
                "entry point",
                f"none named {PLUGIN_ENTRY_POINT} in {ENTRY_POINT_GROUP}: "
                "not installed in this environment",
            )
        )
        ok = False
    effect, allowed = _vllm_plugins_effect()
    rows.append(("VLLM_PLUGINS", effect))
    ok = ok and allowed
    if problem is not None:
        rows.append(
            ("loaded by vLLM", f"not checked: {problem}. {SUPPORTED_VLLM_INSTALL}")
        )
        return rows, False
    if found and allowed:
        # vLLM's own loader, as every vLLM process runs it (it imports the
        # plugin's entry point; register() is not called, nothing is patched).
        from vllm.plugins import load_plugins_by_group

        loaded = PLUGIN_ENTRY_POINT in load_plugins_by_group(ENTRY_POINT_GROUP)
        rows.append(
            (
                "loaded by vLLM",
                "yes" if loaded else "no: its import failed (see the log above)",
            )
        )
        ok = ok and loaded
    if not (found and allowed):
        rows.append(("register()", "not reached: vLLM does not load the plugin here"))
        return rows, False
    from vllm_minimax_m3_kv import patches

    reasons = patches.unsupported_reasons()
    decided = None if reasons else patches.activation()
    if decided is None:
        answer = f"would be inactive: {'; '.join(reasons)}"
    else:
        answer = f"would activate {', '.join(p.name for p in decided.apply)}"
        if decided.left_out:
            answer += "; would leave out " + "; ".join(
                f"{name} ({why})" for name, why in decided.left_out
            )
    rows.append(("register()", answer))
    return rows, ok and decided is not None and not decided.left_out


def main(argv: list[str] | None = None) -> int:
    """``vllm-minimax-m3-kv status [--json | --quiet]``."""
    import argparse

    from vllm_minimax_m3_kv.entrypoints.output import (
        Output,
        add_output_flags,
        aligned,
    )

    parser = argparse.ArgumentParser(
        prog=f"{DISTRIBUTION} status",
        description="Is the plugin installed and loadable on this node? Offline: "
        "nothing is patched, no GPU is touched. Exit 0: vLLM would load it and "
        "it would be active; 1: it would not (each row says why).",
    )
    add_output_flags(parser)
    args = parser.parse_args(argv)
    rows, ok = report()
    code = 0 if ok else 1
    Output.asked_by(args).answer(aligned(rows), {"exit": code, "report": dict(rows)})
    return code
