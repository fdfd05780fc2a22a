"""Shared fixtures: run scenarios through real vLLM on a simulated platform.

Each platform needs its own process (vLLM resolves its platform once per
process), so scenarios are batched per (platform, extra environment) and run
in one child process; results are cached for the whole session.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

import pytest

from tests.sim.process import REPO, child_env, json_from_out_file

__all__ = ["REPO", "child_env", "run_scenarios"]

_cache: dict[str, dict[str, dict[str, Any]]] = {}


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
        scenario_file.write_text(json.dumps(scenarios))
        argv = ["-m", "tests.sim.runner", "--platform", platform]
        records = json_from_out_file(
            [*argv, "--scenarios", str(scenario_file)], env, timeout
        )
    _cache[key] = {r["id"]: r for r in records}
    return _cache[key]


@pytest.fixture(scope="session")
def scenario_runner():
    return run_scenarios
