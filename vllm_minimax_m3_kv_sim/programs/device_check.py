"""The device check: what only a GPU can show, in one command under ten minutes.

On the lent GPU machine (torch and Triton, no vLLM), with the bundle from
``vllm_minimax_m3_kv_sim.device_bundle`` first on the path::

    PYTHONPATH=device_bundle:. python -m vllm_minimax_m3_kv_sim.programs.device_check --out "$OUT"

1. **Start safety, natively.** The node self-test's gate verdict
   (``selftest_gate.node_verdict``) asked inside the context vLLM's model
   build sets: ``torch.device("cuda")`` default device, bf16 default dtype. It
   must pass, leave the scorers' autotuner caches as it found them, and keep
   its verdict; a second ask reads the kept verdict. Both are timed: the start
   cost with and without a cached verdict.
2. **The replay file**: the self-test's inputs, bytes, scores and top-k on
   this GPU, pass or fail, which ``tests/kernels/test_device_records.py``
   judges and runs again on a CPU under Triton's interpreter once it is
   committed under ``tests/data/device_records/``.
3. **Score errors**: the self-test's judge over ``--seeds`` more seeds on its
   serving-shaped batch and on one 96-block sequence: how much of its bound
   this GPU's matrix unit uses.
4. **Mutants, natively**: each defect of ``vllm_minimax_m3_kv_sim.mutants``
   (one table for every request, a NaN score) put into vLLM's scorers in turn:
   the self-test must fail on this GPU too.
5. **Decode cost**: ``vllm-minimax-m3-kv bench`` on this GPU (vLLM's CUDA
   Triton scorers, bf16 vs fp8, cold cache, the plan it prints with ``--plan``).

Writes ``device_check.json`` and ``selftest_record.pt`` into ``--out``.
``--cpu`` runs steps 1, 2 and 4 on a CPU under Triton's interpreter, ``meta``
standing for the GPU (how the tests check this program without a GPU).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any


def _stand_in_vllm() -> bool:
    import vllm

    return bool(getattr(vllm, "STAND_IN", False))


def _autotune_state() -> dict[str, int]:
    from vllm_minimax_m3_kv.selftest import _autotuners, scorer_module

    return {t.base_fn.__name__: len(t.cache) for t in _autotuners(scorer_module())}


def start_safety(device: str) -> dict[str, Any]:
    """The gate's verdict from a model-build context, cold then cached."""
    import torch

    from vllm_minimax_m3_kv import selftest_gate
    from vllm_minimax_m3_kv.selftest import verdict_line

    asks = []
    before = _autotune_state()
    for _ in range(2):
        default_dtype = torch.get_default_dtype()
        torch.set_default_dtype(torch.bfloat16)
        start = time.perf_counter()
        try:
            with torch.device(device):
                result = selftest_gate.node_verdict()
        finally:
            torch.set_default_dtype(default_dtype)
        if device == "cuda":
            torch.cuda.synchronize()
        asks.append(
            {
                "seconds": time.perf_counter() - start,
                "passed": result.passed,
                "cached": result.record.get("cached"),
                "line": verdict_line(result),
                "failures": result.failures[:5],
            }
        )
        if len(asks) == 1:
            record = result.record
        if not asks[0]["passed"]:
            break
    return {
        "asks": asks,
        "autotune_before": before,
        "autotune_after": _autotune_state(),
        # Kept pass or fail: a failing record is the evidence to read.
        "record": record,
    }


def score_errors(device: str, seeds: int) -> dict[str, Any]:
    """The self-test's judge over more seeds and a longer context: each run's
    worst score error as a fraction of its bound (how much room this GPU's
    matrix unit leaves), and whether it passed."""
    from vllm_minimax_m3_kv.selftest import Case
    from vllm_minimax_m3_kv.selftest_gate import run_selftest

    runs = []
    for blocks in (24, 96):
        for seed in range(seeds):
            case = Case(seed=seed) if blocks == 24 else Case.single(blocks, seed=seed)
            result = run_selftest(case, device=device)
            runs.append(
                {
                    "blocks": blocks,
                    "seed": seed,
                    "passed": result.passed,
                    "score_error": result.record["score_error"],
                    "failures": result.failures[:2],
                }
            )
    return {
        "runs": len(runs),
        "passed": sum(run["passed"] for run in runs),
        "worst_score_error": max(run["score_error"] for run in runs),
        "detail": runs,
    }


def mutants(device: str) -> dict[str, Any]:
    """Each kernel mutant's verdict on this device (each must fail)."""
    from vllm_minimax_m3_kv.selftest_gate import run_selftest
    from vllm_minimax_m3_kv_sim.mutants import KERNEL_MUTANTS, restoring_the_indexer

    verdicts = {}
    for name, put_in in KERNEL_MUTANTS.items():
        restore = restoring_the_indexer()
        put_in()
        try:
            result = run_selftest(device=device)
        finally:
            restore()
        verdicts[name] = {"passed": result.passed, "failures": result.failures[:2]}
    return verdicts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--cpu", action="store_true", help="interpreter, meta device")
    parser.add_argument("--iters", type=int, default=50)
    parser.add_argument("--seeds", type=int, default=16, help="score-error sweep")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("VLLM_CACHE_ROOT", str(args.out / "vllm_cache"))
    if args.cpu:
        if os.environ.get("TRITON_INTERPRET") != "1":
            raise SystemExit("--cpu needs TRITON_INTERPRET=1 in the environment")
        from vllm_minimax_m3_kv_sim.kernels import pin_first_autotune_config

        pin_first_autotune_config()
    import torch
    import triton

    from vllm_minimax_m3_kv.entrypoints.selftest import save_record

    device = "meta" if args.cpu else "cuda"
    report: dict[str, Any] = {
        "gpu": None if args.cpu else torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "vllm_is_stand_in": _stand_in_vllm(),
    }
    bundle = Path(sys.modules["vllm"].__file__).parents[1] / "manifest.json"
    if bundle.is_file():
        report["bundle"] = json.loads(bundle.read_text(encoding="utf-8"))
    safety = start_safety(device)
    record = safety.pop("record")
    report["start_safety"] = safety
    if record is not None:
        save_record(record, args.out / "selftest_record.pt")
    from vllm_minimax_m3_kv.selftest import kernel_device

    report["mutants"] = mutants(kernel_device())
    print("mutants:", report["mutants"], flush=True)
    if not args.cpu:
        from vllm_minimax_m3_kv.entrypoints.bench import measure

        report["score_errors"] = score_errors(device, args.seeds)
        print(
            "score errors:",
            {k: v for k, v in report["score_errors"].items() if k != "detail"},
            flush=True,
        )

        report["decode_scorer"] = measure(args.iters, quick=False)
    (args.out / "device_check.json").write_text(json.dumps(report, indent=1))
    print(json.dumps(report["start_safety"]["asks"], indent=1))
    caught = all(not m["passed"] for m in report.get("mutants", {}).values())
    return 0 if safety["asks"][0]["passed"] and caught else 1


if __name__ == "__main__":
    sys.exit(main())
