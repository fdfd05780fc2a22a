"""Shared fixtures: run scenarios through real vLLM on a simulated platform.

Each platform needs its own process (vLLM resolves its platform once per
process), so scenarios are batched per (platform, extra environment) and run
in one child process; results are cached for the whole session.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).parents[1]
_cache: dict[str, dict[str, dict[str, Any]]] = {}


def child_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """This environment without the variables a test must set explicitly."""
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith("VLLM_ROCM_") and key != "VLLM_TARGET_DEVICE"
    }
    return {**env, **(extra or {})}


def run_scenarios(
    platform: str,
    scenarios: list[dict[str, Any]],
    env: dict[str, str] | None = None,
    timeout: float = 900,
) -> dict[str, dict[str, Any]]:
    """Results by scenario id, from one child process on ``platform``."""
    key = json.dumps([platform, scenarios, env], sort_keys=True)
    if key in _cache:
        return _cache[key]
    with tempfile.TemporaryDirectory() as tmp:
        scenario_file = Path(tmp, "scenarios.json")
        out_file = Path(tmp, "results.json")
        scenario_file.write_text(json.dumps(scenarios))
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "tests.sim.runner",
                "--platform",
                platform,
                "--scenarios",
                str(scenario_file),
                "--out",
                str(out_file),
            ],
            cwd=REPO,
            env=child_env(env),
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if proc.returncode != 0 or not out_file.exists():
            raise AssertionError(
                f"scenario runner failed on {platform} (exit {proc.returncode}):\n"
                + proc.stderr[-4000:]
            )
        results = {r["id"]: r for r in json.loads(out_file.read_text())}
    _cache[key] = results
    return results


@pytest.fixture(scope="session")
def scenario_runner():
    return run_scenarios
