"""The node self-test: vLLM's indexer scorers on an fp8 index cache, on this GPU.

Before the plugin lets vLLM's Triton indexer read an fp8 index cache on ROCm
(``minimax_m3_rocm_fp8_triton_indexer``), each worker process runs this once:
the scorers vLLM's indexer module imports on this platform (prefill score and
top-k, decode at query length 1 and 2), on synthetic RMS-normed keys and
queries with planted winners, stored as e4m3 the way the writer stores them
(clamped to +-448, one rounding). Judged on the node's own results:

* prefill scores within one fp32 ulp of an fp64 reference on the same bytes
  (fp32 sums of e4m3 products are exact for almost every row);
* every top-k identical to the same kernels' top-k on the same values held in
  bf16 (exact: e4m3 values are bf16 values), ties at the boundary aside;
* every planted block selected.

``vllm-minimax-m3-kv selftest`` runs it by hand and can write a replay file
(inputs, bytes, scores, top-k) that ``replay`` runs again, bit for bit, on
another machine, Triton's interpreter included (``tests/kernels/``).

What it does not run: the fused writer (``fused_minimax_m3_qknorm_rope_kv_insert``)
is a HIP/CUDA op; its bytes are taken on trust from its source (a saturating,
single-rounded e4m3 cast), and this test says so.
"""

from __future__ import annotations

import math
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vllm_minimax_m3_kv.envs import SKIP_SELFTEST_ENV, skip_selftest_from_env

E4M3_MAX = 448.0
SPARSE_BLOCK = 128
WRITER_NOT_RUN = (
    "writer: not run (vLLM's fused index-K insert is a GPU op; its e4m3 bytes "
    "are taken from its source: saturating, single-rounded)"
)
FAILURE_FIXES = (
    f"{SKIP_SELFTEST_ENV}=1  # serve anyway (only on an image verified before)",
    "--kv-cache-dtype auto  # main cache bf16, no fp8 index cache",
)


@dataclass(frozen=True)
class Case:
    """The synthetic request the scorers are run on."""

    blocks: int = 24
    """Context length in 128-token blocks."""
    index_dim: int = 128
    topk: int = 16
    init_blocks: int = 0
    local_blocks: int = 1
    prefill_queries: int = 4
    planted: tuple[int, ...] = (2, 9, 17)
    """Blocks holding one key aligned with every query: always selected."""
    decode_requests: int = 3
    short_tail: int = 50
    """Tokens the last block lacks: its slots past the sequence hold
    whatever the cache held (stale bytes), which no score may read."""
    seed: int = 0

    @property
    def seq_len(self) -> int:
        return self.blocks * SPARSE_BLOCK - self.short_tail


@dataclass
class Result:
    """What one run of the scorers gave, and the verdict on it."""

    failures: list[str] = field(default_factory=list)
    checked: int = 0
    record: dict[str, Any] = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return not self.failures and self.checked > 0


class SelftestFailed(RuntimeError):
    """The fp8 indexer's scorers did not hold on this GPU: do not serve."""


def e4m3(values: Any) -> Any:
    """fp32 values as the index writer stores them: clamped, one rounding."""
    import torch

    return values.float().clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)


def _rms_normed(generator: Any, rows: int, dim: int) -> Any:
    import torch

    x = torch.randn(rows, dim, generator=generator)
    return x / x.pow(2).mean(-1, keepdim=True).sqrt()


def make_inputs(case: Case) -> dict[str, Any]:
    """Keys, prefill and decode queries (fp32, before storage), planted."""
    import torch

    generator = torch.Generator().manual_seed(case.seed)
    # Whole blocks: the last block's tail is generated but never stored.
    keys = _rms_normed(generator, case.blocks * SPARSE_BLOCK, case.index_dim)
    prefill_q = _rms_normed(generator, case.prefill_queries, case.index_dim)
    decode_q = _rms_normed(generator, case.decode_requests * 2, case.index_dim)
    direction = _rms_normed(generator, 1, case.index_dim)[0]
    # Queries lean towards one direction; one key in each planted block is it,
    # scaled up, so that block's max score wins by far.
    prefill_q = (prefill_q + 2 * direction) / 3
    decode_q = (decode_q + 2 * direction) / 3
    for block in case.planted:
        keys[block * SPARSE_BLOCK + 37] = 3 * direction
    return {"keys": keys, "prefill_q": prefill_q, "decode_q": decode_q}


def _paged(
    case: Case, keys: Any, device: str, stale: int | None = None
) -> tuple[Any, Any]:
    """The keys in a paged cache (pages shuffled, one spare) and its table.
    Slots no token fills (the spare page, the last block's tail) hold zeros,
    or the byte ``stale`` in every byte, as a reused block would."""
    import torch

    generator = torch.Generator().manual_seed(case.seed + 1)
    pages = torch.randperm(case.blocks + 1, generator=generator)[: case.blocks]
    shape = (case.blocks + 1, SPARSE_BLOCK, case.index_dim)
    raw = torch.full(
        (math.prod(shape) * keys.element_size(),), stale or 0, dtype=torch.uint8
    )
    cache = raw.view(keys.dtype).view(shape).to(device)
    blocks = keys.to(device).view(case.blocks, SPARSE_BLOCK, case.index_dim)
    pages = pages.to(device)
    cache[pages[:-1]] = blocks[:-1]
    filled = SPARSE_BLOCK - case.short_tail
    cache[pages[-1], :filled] = blocks[-1, :filled]
    return cache, pages.to(torch.int32).view(1, -1)


def run_scorers(
    case: Case,
    keys: Any,
    prefill_q: Any,
    decode_q: Any,
    device: str,
    stale: int | None = None,
) -> dict[str, Any]:
    """vLLM's scorers, as its indexer module imports them on this platform,
    on keys and queries of one dtype (e4m3 or bf16). Returns their outputs."""
    import torch
    from vllm.models.minimax_m3.common import indexer as vllm_indexer

    cache, table = _paged(case, keys, device, stale)
    n, length = case.prefill_queries, case.seq_len
    i32 = {"dtype": torch.int32, "device": device}
    cu_seqlens = torch.tensor([0, n], **i32)
    seq_lens = torch.tensor([length], **i32)
    prefix = torch.tensor([length - n], **i32)
    q = prefill_q.to(device).view(n, 1, case.index_dim)
    score = vllm_indexer.minimax_m3_index_score(
        q, cache, table, cu_seqlens, seq_lens, prefix, n, length, 1
    )
    prefill_topk = vllm_indexer.minimax_m3_index_topk(
        score, cu_seqlens, prefix, n, case.topk, case.init_blocks, case.local_blocks
    )
    outputs = {
        # Columns past the last block are the stride's padding, never written.
        "prefill_score": score[..., : math.ceil(length / SPARSE_BLOCK)].cpu(),
        "prefill_topk": prefill_topk.cpu(),
    }
    requests = case.decode_requests
    tables = table.expand(requests, -1).contiguous()
    lens = torch.full((requests,), length, **i32)
    for query_len in (1, 2):  # the plain decode and the spec-decode paths
        dq = decode_q[: requests * query_len].to(device)
        outputs[f"decode_topk_q{query_len}"] = vllm_indexer.minimax_m3_index_decode(
            dq.view(-1, 1, case.index_dim), cache, tables, lens, length,
            case.topk, case.init_blocks, case.local_blocks, 1, query_len, 2,
        ).cpu()  # fmt: skip
    return outputs


def reference_scores(case: Case, keys: Any, prefill_q: Any) -> Any:
    """fp64 prefill scores on the stored values: per query, the max over each
    block's causally visible keys of q.k (-inf where none is visible)."""
    import torch

    k = keys.double().view(case.blocks, SPARSE_BLOCK, case.index_dim)
    q = prefill_q.double()
    dots = torch.einsum("qd,bpd->qbp", q, k)
    positions = torch.arange(case.blocks * SPARSE_BLOCK).view(case.blocks, SPARSE_BLOCK)
    query_pos = torch.arange(case.seq_len - case.prefill_queries, case.seq_len)
    visible = positions[None] <= query_pos[:, None, None]
    dots = dots.masked_fill(~visible, -math.inf)
    return dots.amax(-1).view(1, case.prefill_queries, case.blocks)


def _ulp(values: Any) -> Any:
    import torch

    finite = values.float().abs().clamp_min(torch.finfo(torch.float32).tiny)
    return torch.nextafter(finite, torch.full_like(finite, math.inf)) - finite


def _selected(topk_row: Any) -> set[int]:
    return {int(b) for b in topk_row.tolist() if b >= 0}


def judge(case: Case, fp8: dict[str, Any], bf16: dict[str, Any], ref: Any) -> Result:
    """The verdict on one run: scores vs fp64, top-k vs bf16, planted kept."""
    import torch

    result = Result()
    score = fp8["prefill_score"].double()
    both_inf = torch.isinf(score) & torch.isinf(ref) & (score.sign() == ref.sign())
    off = ((score - ref).abs() > _ulp(ref).double()) & ~both_inf
    result.checked += score.numel()
    if off.any():
        worst = float((score - ref).abs().masked_fill(both_inf, 0).max())
        result.failures.append(
            f"prefill scores: {int(off.sum())} of {score.numel()} off the fp64 "
            f"reference by more than one ulp (worst {worst:.3g})"
        )
    for name in ("prefill_topk", "decode_topk_q1", "decode_topk_q2"):
        got, want = fp8[name], bf16[name]
        rows = got.reshape(-1, got.shape[-1])
        for row, (a, b) in enumerate(
            zip(rows, want.reshape(-1, got.shape[-1]), strict=True)
        ):
            result.checked += 1
            picked = _selected(a)
            if picked != _selected(b) and not _boundary_tie(case, fp8, name, row):
                result.failures.append(
                    f"{name} row {row}: fp8 picked {sorted(picked)}, the same "
                    f"values in bf16 {sorted(_selected(b))}"
                )
            missing = set(case.planted) - picked
            if missing:
                result.failures.append(
                    f"{name} row {row}: planted blocks {sorted(missing)} not selected"
                )
    return result


def _boundary_tie(case: Case, fp8: dict[str, Any], name: str, row: int) -> bool:
    """Prefill rows whose k-th and (k+1)-th scores tie within an ulp may pick
    either block (decode scores are internal to the kernel: no tolerance)."""
    if name != "prefill_topk":
        return False
    scores = fp8["prefill_score"].reshape(-1, case.blocks)[row]
    finite = scores[scores.isfinite()].sort(descending=True).values
    if finite.numel() <= case.topk:
        return False
    kth, next_ = finite[case.topk - 1], finite[case.topk]
    return bool((kth - next_).abs() <= _ulp(kth.view(1))[0])


def run_selftest(case: Case | None = None, device: str | None = None) -> Result:
    """Run the scorers on this device in e4m3 and bf16, and judge them."""
    import torch

    case = case or Case()
    device = device or kernel_device()
    inputs = make_inputs(case)
    stored = {name: e4m3(value) for name, value in inputs.items()}
    # Model construction sets a meta default device; these are real tensors.
    with torch.device("cpu"):
        fp8 = run_scorers(case, *stored.values(), device=device)
        as_bf16 = [value.to(torch.bfloat16) for value in stored.values()]
        bf16 = run_scorers(case, *as_bf16, device=device)
        ref = reference_scores(case, stored["keys"].float(), stored["prefill_q"])
        result = judge(case, fp8, bf16, ref)
    result.record = {
        "case": case.__dict__,
        "device": _device_name(device),
        "bytes": {name: value.view(torch.uint8) for name, value in stored.items()},
        "outputs": fp8,
    }
    return result


def replay(record: dict[str, Any], device: str | None = None) -> list[str]:
    """Run the recorded bytes through this machine's scorers; return every
    output that differs from the recorded one (empty: bit for bit)."""
    import torch

    case = Case(**{k: tuple(v) if isinstance(v, list) else v
                   for k, v in record["case"].items()})  # fmt: skip
    stored = [
        record["bytes"][name].view(torch.float8_e4m3fn)
        for name in ("keys", "prefill_q", "decode_q")
    ]
    with torch.device("cpu"):
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


def kernel_device() -> str:
    """Where the scorers run: the GPU, or the CPU under Triton's interpreter."""
    import torch

    if os.environ.get("TRITON_INTERPRET") == "1":
        return "cpu"
    return "cuda" if torch.cuda.is_available() else "cpu"


def _device_name(device: str) -> str:
    import torch

    if device == "cuda":
        return torch.cuda.get_device_name()
    return "CPU (Triton interpreter)"


def verdict_line(result: Result) -> str:
    if result.passed:
        return (
            f"selftest passed on {result.record.get('device')}: fp8 index scores "
            f"within one ulp of fp64, top-k as bf16, planted blocks kept "
            f"({result.checked} checks); {WRITER_NOT_RUN}"
        )
    return (
        f"selftest FAILED on {result.record.get('device')}: "
        + "; ".join(result.failures[:3])
        + (
            f" (and {len(result.failures) - 3} more)"
            if len(result.failures) > 3
            else ""
        )
    )


_checked = threading.Lock()
_node_result: list[Result] = []


def check_node_once() -> None:
    """Run the self-test once per process before the fp8 Triton indexer is
    selected; stop the start with its fixes if it fails."""
    from vllm_minimax_m3_kv._log import get_logger

    logger = get_logger(__name__)
    if skip_selftest_from_env():
        logger.info_once(
            "MiniMax-M3 fp8 indexer self-test skipped (%s).", SKIP_SELFTEST_ENV
        )
        return
    with _checked:
        if not _node_result:
            _node_result.append(run_node_selftest())
    result = _node_result[0]
    if result.passed:
        logger.info_once("MiniMax-M3 fp8 indexer %s", verdict_line(result))
        return
    if not result.checked:  # no device in this process (a CPU build, a test)
        logger.warning_once("MiniMax-M3 fp8 indexer self-test %s", result.failures[0])
        return
    raise SelftestFailed(
        f"MiniMax-M3 fp8 index cache on vLLM's Triton indexer: {verdict_line(result)}. "
        "This GPU's scorers do not reproduce the fp8 scores; do not serve an fp8 "
        "index cache here.\nFix with one of:\n  " + "\n  ".join(FAILURE_FIXES)
    )


def run_node_selftest() -> Result:
    """The self-test on this process's GPU (not run without one)."""
    import torch

    if not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1":
        return Result(failures=["not run: no GPU in this process"])
    return run_selftest()


def main(argv: list[str] | None = None) -> int:
    """``vllm-minimax-m3-kv selftest [--replay-file PATH]``."""
    import argparse

    parser = argparse.ArgumentParser(
        prog="vllm-minimax-m3-kv selftest",
        description="Run vLLM's MiniMax-M3 indexer scorers on an fp8 index cache "
        "on this GPU and judge them (exit 0: passed).",
    )
    parser.add_argument("--replay-file", type=Path, help="write the run's record here")
    parser.add_argument(
        "--replay", type=Path, help="run a recorded file again, bit for bit"
    )
    args = parser.parse_args(argv)
    if args.replay is not None:
        differs = replay(load_record(args.replay))
        print("replay: bit for bit" if not differs else f"replay differs: {differs}")
        return 0 if not differs else 1
    result = run_node_selftest()
    if not result.checked:
        print(f"selftest {result.failures[0]}")
        return 2
    print(verdict_line(result))
    if args.replay_file is not None:
        save_record(result.record, args.replay_file)
        print(f"replay file: {args.replay_file}")
    return 0 if result.passed else 1
