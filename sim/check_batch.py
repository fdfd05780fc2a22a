"""Run ``vllm-minimax-m3-kv check`` for many argv lists in one process.

``python -m sim.check_batch cases.json --out out.json``; each case is
``{"argv": [...], "env": {...}}``, each result ``{"exit": int, "plan": {...}}``
(``plan`` null where check gave none) and ``"stderr"``, as check prints it.
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict
from pathlib import Path

from vllm_minimax_m3_kv.entrypoints.check.main import stderr_text
from vllm_minimax_m3_kv.entrypoints.check.run import run_check


def run(case: dict) -> dict:
    result = run_check(case["argv"], env=case.get("env", {}))
    plan = None if result.plan is None else asdict(result.plan)
    return {"exit": result.exit, "plan": plan, "stderr": stderr_text(result)}


if __name__ == "__main__":
    cases = json.loads(Path(sys.argv[1]).read_text())
    Path(sys.argv[3]).write_text(json.dumps([run(case) for case in cases]))
