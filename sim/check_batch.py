"""Run ``vllm-minimax-m3-kv check`` for many argv lists in one process.

``python -m sim.check_batch cases.json --out out.json``; each case is
``{"argv": [...], "env": {...}}``, each result ``{"exit": int, "plan": {...}}``.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import sys
from pathlib import Path

from vllm_minimax_m3_kv.entrypoints.check import main


def run(case: dict) -> dict:
    saved = dict(os.environ)
    os.environ.update(case.get("env", {}))
    out, err = io.StringIO(), io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main([*case["argv"], "--json"])
    finally:
        os.environ.clear()
        os.environ.update(saved)
    text = out.getvalue()
    plan = json.loads(text[text.index("{") :]) if "{" in text else None
    return {"exit": code, "plan": plan, "stderr": err.getvalue()[-2000:]}


if __name__ == "__main__":
    cases = json.loads(Path(sys.argv[1]).read_text())
    Path(sys.argv[3]).write_text(json.dumps([run(case) for case in cases]))
