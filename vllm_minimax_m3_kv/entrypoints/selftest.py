"""``vllm-minimax-m3-kv selftest [--replay-file PATH | --replay PATH]``: the
node self-test (:mod:`vllm_minimax_m3_kv.selftest`) by hand, and its replay
files: a run's inputs, bytes, scores and top-k, run again bit for bit on
another machine, Triton's interpreter included."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from vllm_minimax_m3_kv._versions import DISTRIBUTION
from vllm_minimax_m3_kv.selftest import (
    E4M3FN,
    Case,
    isolated_from_caller,
    kernel_device,
    run_scorers,
    scorer_module,
    verdict_line,
)
from vllm_minimax_m3_kv.selftest_gate import (
    node_key,
    run_node_selftest,
    store_result,
    verdict_path,
)

EXIT_PASSED, EXIT_FAILED, EXIT_NOT_RUN = 0, 1, 2
"""``selftest``'s exit codes (a replay that differs exits 1)."""


def replay(record: dict[str, Any], device: str | None = None) -> list[str]:
    """Run the recorded bytes through this machine's scorers; return every
    output that differs from the recorded one (empty: bit for bit)."""
    import torch

    case = Case(**{k: tuple(v) if isinstance(v, list) else v
                   for k, v in record["case"].items()})  # fmt: skip
    fp8 = getattr(torch, record.get("fp8", E4M3FN.dtype))
    stored = [
        record["bytes"][name].view(fp8) for name in ("keys", "prefill_q", "decode_q")
    ]
    with isolated_from_caller(scorer_module()):
        outputs = run_scorers(case, *stored, device=device or kernel_device())
    return [
        name
        for name, recorded in record["outputs"].items()
        if not torch.equal(outputs[name], recorded)
    ]


def save_record(record: dict[str, Any], path: Path) -> None:
    import torch

    torch.save(record, path)


def load_record(path: Path) -> dict[str, Any]:
    import torch

    return torch.load(path, weights_only=True)


def main(argv: list[str] | None = None) -> int:
    """``vllm-minimax-m3-kv selftest [--replay-file PATH]``."""
    import argparse

    parser = argparse.ArgumentParser(
        prog=f"{DISTRIBUTION} selftest",
        description="Run vLLM's MiniMax-M3 indexer scorers on an fp8 index cache "
        "on this GPU and judge them against fp64. Exit 0: passed (the verdict is "
        "kept for this node, so workers starting after it skip the kernels); "
        "1: failed, or a replay differs; 2: not run (no GPU in this process).",
    )
    parser.add_argument("--replay-file", type=Path, help="write the run's record here")
    parser.add_argument(
        "--replay", type=Path, help="run a recorded file again, bit for bit"
    )
    args = parser.parse_args(argv)
    if args.replay is not None:
        differs = replay(load_record(args.replay))
        print("replay: bit for bit" if not differs else f"replay differs: {differs}")
        return EXIT_PASSED if not differs else EXIT_FAILED
    result = run_node_selftest()
    if not result.ran:
        print(f"selftest {result.failures[0]}")
        return EXIT_NOT_RUN
    print(verdict_line(result))
    if result.passed:
        key = node_key(kernel_device())
        store_result(verdict_path(key), key, result)
    if args.replay_file is not None:
        save_record(result.record, args.replay_file)
        print(f"replay file: {args.replay_file}")
    return EXIT_PASSED if result.passed else EXIT_FAILED
