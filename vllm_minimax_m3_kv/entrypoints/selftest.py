"""``vllm-minimax-m3-kv selftest [--replay-file PATH | --replay PATH]``: the
node self-test (:mod:`vllm_minimax_m3_kv.selftest`) by hand, and its replay
files: a run's inputs, bytes, scores and top-k. A replay runs the bytes again
here (Triton's interpreter included) and judges both runs against fp64: the
top-k must match bit for bit; the scores may differ within the judge's bound,
since matrix units add the products in their own order and precision (an
H200's fp8 MMA differs from fp32 sums by up to about 0.1)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from vllm_minimax_m3_kv._versions import DISTRIBUTION
from vllm_minimax_m3_kv.entrypoints.output import Output, add_output_flags
from vllm_minimax_m3_kv.selftest import (
    E4M3FN,
    TOPK_OUTPUTS,
    Case,
    Result,
    isolated_from_caller,
    judge,
    kernel_device,
    references,
    run_scorers,
    scorer_module,
    verdict_line,
)
from vllm_minimax_m3_kv.selftest_gate import node_verdict

EXIT_PASSED, EXIT_FAILED, EXIT_NOT_RUN = 0, 1, 2
"""``selftest``'s exit codes (a replay whose record fails the judge, or whose
top-k differs here, exits 1)."""


def _case_and_bytes(record: dict[str, Any]) -> tuple[Case, dict[str, Any]]:
    import torch

    case = Case(**{k: tuple(v) if isinstance(v, list) else v
                   for k, v in record["case"].items()})  # fmt: skip
    fp8 = getattr(torch, record.get("fp8", E4M3FN.dtype))
    stored = {
        name: record["bytes"][name].view(fp8)
        for name in ("keys", "prefill_q", "decode_q")
    }
    return case, stored


def judge_record(record: dict[str, Any]) -> Result:
    """The recorded outputs judged as the self-test judges a run: against
    fp64 on the recorded bytes (no kernel runs)."""
    case, stored = _case_and_bytes(record)
    result = judge(case, record["outputs"], references(case, stored))
    result.record |= {"device": record.get("device"), "fp8": record.get("fp8")}
    return result


def replay(record: dict[str, Any], device: str | None = None) -> list[str]:
    """Run the recorded bytes through this machine's scorers; return every
    output that differs from the recorded one (empty: bit for bit)."""
    import torch

    case, stored = _case_and_bytes(record)
    with isolated_from_caller(scorer_module()):
        outputs = run_scorers(case, *stored.values(), device=device or kernel_device())
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
        "1: failed, or a replay's record fails or its top-k differs here; 2: not "
        "run (no GPU in this process).",
    )
    parser.add_argument("--replay-file", type=Path, help="write the run's record here")
    parser.add_argument(
        "--replay",
        type=Path,
        help="judge a recorded file and run its bytes again here: the top-k "
        "must match bit for bit, the scores within the judge's bound",
    )
    add_output_flags(parser)
    args = parser.parse_args(argv)
    out = Output.asked_by(args)
    if args.replay is not None:
        record = load_record(args.replay)
        recorded = judge_record(record)
        differs = replay(record)
        topk_differs = [name for name in differs if name in TOPK_OUTPUTS]
        code = EXIT_PASSED if recorded.passed and not topk_differs else EXIT_FAILED
        out.answer(
            f"recorded: {verdict_line(recorded)}\n"
            + (
                "replay: bit for bit"
                if not differs
                else f"replay differs from the record in {differs}"
            ),
            {
                "exit": code,
                "recorded": verdict_line(recorded),
                "recorded_passed": recorded.passed,
                "differs": differs,
                "topk_differs": topk_differs,
            },
        )
        return code
    # A run now (never the kept verdict), kept for the node if it passes;
    # anything the self-test raises is a failed verdict, as in a worker.
    result = node_verdict(use_kept=False)
    if not result.ran:
        out.answer(
            f"selftest {result.failures[0]}",
            {"exit": EXIT_NOT_RUN, "ran": False, "why": result.failures[0]},
        )
        return EXIT_NOT_RUN
    if args.replay_file is not None:
        save_record(result.record, args.replay_file)
    code = EXIT_PASSED if result.passed else EXIT_FAILED
    lines = [verdict_line(result)]
    if args.replay_file is not None:
        lines.append(f"replay file: {args.replay_file}")
    out.answer(
        "\n".join(lines),
        {
            "exit": code,
            "ran": True,
            "passed": result.passed,
            "verdict": verdict_line(result),
            "failures": list(result.failures),
            "replay_file": None if args.replay_file is None else str(args.replay_file),
        },
    )
    return code
