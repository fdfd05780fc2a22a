"""Run ``vllm-minimax-m3-kv check`` for many argv lists in one process.

``python -m vllm_minimax_m3_kv_sim.programs.check_batch cases.json --out out.json [--simulate GPU:AITER]``;
each case is ``{"argv": [...], "env": {...}}``, each result ``{"exit": int,
"plan": {...}, "stderr": str}`` (``plan`` null where check gave none; stderr
as check prints it). ``--simulate mi355x:absent`` makes this process's GPU
and aiter that node's first, for ``--target here`` (``vllm_minimax_m3_kv_sim.hardware``).
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict
from pathlib import Path


def run(case: dict) -> dict:
    from vllm_minimax_m3_kv.entrypoints.check.main import stderr_text
    from vllm_minimax_m3_kv.entrypoints.check.run import run_check

    result = run_check(case["argv"], env=case.get("env", {}))
    plan = None if result.plan is None else asdict(result.plan)
    return {"exit": result.exit, "plan": plan, "stderr": stderr_text(result)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("cases", type=Path)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--simulate", metavar="GPU:AITER")
    options = parser.parse_args()
    if options.simulate:
        from vllm_minimax_m3_kv_sim.hardware import simulate

        simulate(*options.simulate.split(":"))
    cases = json.loads(options.cases.read_text())
    options.out.write_text(json.dumps([run(case) for case in cases]))


if __name__ == "__main__":
    main()
