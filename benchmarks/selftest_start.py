"""What the node self-test adds to a worker's start, with and without a kept verdict.

``python -m benchmarks.selftest_start [--json]``

Per simulated GPU (MI355X e4m3fn, MI300X e4m3fnuz; AITER off), two worker-like
processes ask vLLM's ``select_indexer_impl_cls`` for an fp8 index cache from a
model-build context (bf16 default dtype, ``meta`` default device), as each
worker's model build does: the first with an empty cache root (the self-test
runs its kernels, here under Triton's interpreter on a CPU), the second with
the verdict the first kept. Reports the seconds the call took in each and the
ratio, from one run. On a GPU the cold figure is far smaller (these kernels run
in milliseconds there); the device check measures it there
(``vllm_minimax_m3_kv_sim/programs/device_check.py``).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks._common import print_result, run_child, table
from vllm_minimax_m3_kv_sim.kernels import kernel_env

MODULE = "benchmarks.selftest_start"
HARDWARE = ("mi355x", "mi300x")


def child(hardware: str) -> dict[str, Any]:
    import os

    from vllm_minimax_m3_kv_sim.kernels import prepare_triton

    prepare_triton(hardware)
    os.environ.setdefault("VLLM_PLUGINS", "minimax_m3_kv")
    from vllm.plugins import load_general_plugins

    load_general_plugins()
    import torch
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.models.minimax_m3.common import indexer
    from vllm.utils.torch_utils import set_default_torch_dtype

    from vllm_minimax_m3_kv.selftest_gate import selftest_state

    with (
        set_current_vllm_config(VllmConfig()),
        set_default_torch_dtype(torch.bfloat16),
        torch.device("meta"),
    ):
        start = time.perf_counter()
        selected = indexer.select_indexer_impl_cls(
            topk_blocks=16, indexer_kv_dtype="fp8"
        )
        seconds = time.perf_counter() - start
    state = selftest_state()
    return {
        "selected": selected.__name__,
        "seconds": seconds,
        "passed": state["passed"],
        "cached": bool(state["cached"]),
    }


def measure() -> dict[str, Any]:
    rows = []
    for hardware in HARDWARE:
        with tempfile.TemporaryDirectory() as cache_root:
            env = {**kernel_env(), "VLLM_CACHE_ROOT": cache_root}
            cold = run_child(MODULE, ["--hardware", hardware], env)
            warm = run_child(MODULE, ["--hardware", hardware], env)
        if not (cold["passed"] and warm["passed"] and warm["cached"]):
            raise RuntimeError(f"{hardware}: {cold} / {warm}")
        rows.append({"hardware": hardware, "cold": cold, "warm": warm})
    return {"rows": rows}


def render(result: dict[str, Any]) -> str:
    body = [
        [
            row["hardware"],
            f"{row['cold']['seconds']:.2f}",
            f"{row['warm']['seconds'] * 1000:.1f}",
            f"{row['cold']['seconds'] / row['warm']['seconds']:,.0f}x",
        ]
        for row in result["rows"]
    ]
    return table(
        ["simulated GPU", "self-test run (s, CPU interpreter)", "kept verdict (ms)",
         "ratio"],
        body,
    )  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print JSON only")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--hardware", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    options = parser.parse_args()
    if options.child:
        Path(options.out).write_text(json.dumps(child(options.hardware)))
        return
    start = time.perf_counter()
    print_result(measure(), render, start, options.json)


if __name__ == "__main__":
    main()
