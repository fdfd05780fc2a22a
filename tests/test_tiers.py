"""The fast tier is what it says: the policy and docs tests, with no vLLM
(or torch) import in the run; the upstream tier stays out of the default run."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.conftest import TIER_PROBE_ENV
from vllm_minimax_m3_kv_sim import REPO
from vllm_minimax_m3_kv_sim.plumbing.children import child_env


def test_the_fast_tier_imports_neither_vllm_nor_torch(tmp_path):
    probe = tmp_path / "probe.json"
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-m", "fast", "-p", "no:cacheprovider"],
        cwd=REPO,
        env={**child_env(), TIER_PROBE_ENV: str(probe)},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert json.loads(probe.read_text()) == {"vllm": False, "torch": False}
    passed = int(proc.stdout.strip().splitlines()[-1].split()[0])
    assert passed >= 370  # the policy grid, the docs checks, the package shape


def test_the_default_run_leaves_the_upstream_tier_out(request):
    marked = [item for item in request.session.items if "upstream" in item.keywords]
    assert marked == []  # -m 'not upstream' (pyproject addopts)


def test_tiers_are_declared_in_one_place():
    # conftest.py's tables mark every tier; no test module marks its own.
    tiers = {"fast", "upstream", "slow"}
    self_marked = [
        str(path.relative_to(REPO))
        for path in (REPO / "tests").rglob("*.py")
        if path.name != "conftest.py"
        and any(
            f"pytest.mark.{tier}" in path.read_text(encoding="utf-8")
            and path != Path(__file__)
            for tier in tiers
        )
    ]
    assert not self_marked
