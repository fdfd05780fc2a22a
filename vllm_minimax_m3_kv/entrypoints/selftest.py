"""``vllm-minimax-m3-kv selftest [--replay-file PATH | --replay PATH]``: the
node self-test (:mod:`vllm_minimax_m3_kv.selftest`) by hand, and its replay
files: a run's inputs, bytes, scores and top-k. A replay runs the bytes again
here and judges both runs against fp64: the top-k must match bit for bit; the
scores may differ within the judge's bound, since matrix units add the
products in their own order and precision (an H200's fp8 MMA differs from fp32
sums by up to about 0.1). On a machine without a GPU the replay runs vLLM's
scorers under Triton's interpreter (set up here, before vLLM is imported).

``--json`` prints one object of one schema (:func:`json_answer`) in every mode.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from vllm_minimax_m3_kv._versions import DISTRIBUTION
from vllm_minimax_m3_kv.entrypoints.output import Output, add_output_flags
from vllm_minimax_m3_kv.selftest import (
    E4M3FN,
    Case,
    Result,
    isolated_from_caller,
    kernel_device,
    run_scorers,
    scorer_module,
    verdict_line,
)
from vllm_minimax_m3_kv.selftest_gate import node_verdict
from vllm_minimax_m3_kv.selftest_judge import TOPK_OUTPUTS, judge, references

EXIT_PASSED, EXIT_FAILED, EXIT_NOT_RUN = 0, 1, 2
"""``selftest``'s exit codes (a replay whose record fails the judge, or whose
top-k differs here, exits 1)."""
JSON_SCHEMA = 1


def json_answer(
    code: int,
    *,
    ran: bool,
    result: Result | None = None,
    why: str | None = None,
    replay_file: Path | None = None,
    replay: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """``selftest --json``: every key in every answer (None where it does not
    apply): ``schema``, ``exit``, ``ran``, ``passed``, ``verdict``,
    ``failures``, ``why`` (not run), ``replay_file`` (written) and ``replay``
    (a replay's record verdict and what differs here)."""
    return {
        "schema": JSON_SCHEMA,
        "exit": code,
        "ran": ran,
        "passed": None if result is None else result.passed,
        "verdict": None if result is None else verdict_line(result),
        "failures": [] if result is None else list(result.failures),
        "why": why,
        "replay_file": None if replay_file is None else str(replay_file),
        "replay": replay,
    }


def interpret_without_a_gpu() -> str:
    """Where a replay runs: this GPU, or, without one, vLLM's scorers under
    Triton's interpreter. Call before vLLM is imported: its Triton utilities
    keep Triton only where a driver is active or ``CUDA_VISIBLE_DEVICES`` is
    set (empty is enough), and the interpreter is chosen as kernels are
    defined. The autotuner cannot time configs without a driver: the first is
    taken (only speed depends on it)."""
    if os.environ.get("TRITON_INTERPRET") != "1":
        import torch

        if torch.cuda.is_available():
            return "cuda"
        os.environ["TRITON_INTERPRET"] = "1"
    os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
    os.environ.setdefault("HIP_VISIBLE_DEVICES", "")
    pin_first_autotune_config()
    return "cpu"


def pin_first_autotune_config() -> None:
    """Every Triton autotuner keeps its first config (no driver to time them)."""
    from triton.runtime import autotuner

    choose = autotuner.Autotuner.prune_configs
    if hasattr(choose, "__wrapped__"):
        return

    def first_config(self: Any, kwargs: dict, *args: Any, **more: Any) -> list:
        return choose(self, kwargs, *args, **more)[:1]

    first_config.__wrapped__ = choose  # type: ignore[attr-defined]
    autotuner.Autotuner.prune_configs = first_config


def _case_and_bytes(record: dict[str, Any]) -> tuple[Case, dict[str, Any]]:
    import torch

    case = Case.from_record(record["case"])
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
        device = interpret_without_a_gpu()
        record = load_record(args.replay)
        recorded = judge_record(record)
        differs = replay(record, device)
        topk_differs = [name for name in differs if name in TOPK_OUTPUTS]
        code = EXIT_PASSED if recorded.passed and not topk_differs else EXIT_FAILED
        here = scorer_module().__name__
        out.answer(
            f"recorded: {verdict_line(recorded)}\n"
            + f"replay here ({device}, {here}): "
            + (
                "bit for bit"
                if not differs
                else f"top-k differs from the record in {topk_differs}"
                if topk_differs
                else "every top-k bit for bit; the scores differ in rounding "
                "(the record's are judged within the bound above)"
            ),
            json_answer(
                code,
                ran=True,
                result=recorded,
                replay={
                    "record": str(args.replay),
                    "device": device,
                    "scorers": here,
                    "differs": differs,
                    "topk_differs": topk_differs,
                },
            ),
        )
        return code
    # A run now (never the kept verdict), kept for the node if it passes;
    # anything the self-test raises is a failed verdict, as in a worker.
    result = node_verdict(use_kept=False)
    if not result.ran:
        out.answer(
            f"selftest {result.failures[0]}",
            json_answer(EXIT_NOT_RUN, ran=False, why=result.failures[0]),
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
        json_answer(code, ran=True, result=result, replay_file=args.replay_file),
    )
    return code
