"""Child processes for simulated platforms: vLLM fixes its platform once per process.

Shared by the tests, the reliability report and the benchmarks.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
# Set per child by whoever needs them, never inherited from the caller's shell.
_OWN_VARIABLES = ("VLLM_PLUGINS", "VLLM_TARGET_DEVICE")


def child_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """This environment without the variables a child must be given explicitly."""
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith("VLLM_ROCM_") and key not in _OWN_VARIABLES
    }
    env["PYTHONPATH"] = os.pathsep.join(
        filter(None, [str(REPO), env.get("PYTHONPATH")])
    )
    return {**env, **(extra or {})}


def _run(argv: list[str], env: dict[str, str] | None, timeout: float) -> str:
    proc = subprocess.run(
        [sys.executable, *argv],
        cwd=REPO,
        env=child_env(env),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if proc.returncode != 0:
        raise RuntimeError(
            f"{' '.join(argv[:4])} failed (exit {proc.returncode}):\n"
            + proc.stderr[-4000:]
        )
    return proc.stdout


def json_from_stdout(
    argv: list[str], env: dict[str, str] | None = None, timeout: float = 900
) -> Any:
    """Run ``python ARGV``; its last line of output is JSON."""
    return json.loads(_run(argv, env, timeout).strip().splitlines()[-1])


def json_from_out_file(
    argv: list[str], env: dict[str, str] | None = None, timeout: float = 1200
) -> Any:
    """Run ``python ARGV --out FILE`` and read the JSON it wrote."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp, "out.json")
        _run([*argv, "--out", str(out)], env, timeout)
        return json.loads(out.read_text())
