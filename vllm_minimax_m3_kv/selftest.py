"""The node self-test: vLLM's indexer scorers on an fp8 index cache, on this GPU.

Before the plugin lets vLLM's Triton indexer read an fp8 index cache on ROCm
(``minimax_m3_rocm_fp8_triton_indexer``), each worker process runs this once:
the scorers vLLM's indexer module imports on this platform (prefill score and
top-k, decode at query length 1 and 2), on synthetic RMS-normed keys and
queries with planted winners, stored in the platform's fp8 e4m3 type the way
the writer stores them (clamped to vLLM's range, one rounding: e4m3fn +-448 on
gfx950, e4m3fnuz +-224 on gfx942). Judged on the node's own results:

* prefill scores within one fp32 ulp of an fp64 reference on the same bytes
  (fp32 sums of e4m3 products are exact for almost every row);
* every top-k identical to the same kernels' top-k on the same values held in
  bf16 (exact: e4m3 values are bf16 values), ties at the boundary aside;
* every planted block selected.

The writer half, on gfx942: the plugin's fnuz index writer
(``minimax_m3_rocm_fnuz_index_writer``) on this GPU, its bytes against torch's
clamp-and-cast of the same values (outliers past the range included), padded
slots untouched; it reports the largest magnitude it clamped. On gfx950 the
writer is vLLM's fused op (a HIP op this test does not call): its bytes are
taken from its source (saturating, single-rounded), and the verdict says so.
Under Triton's interpreter (CPU) the writer half does not run: the
interpreter's fp8 casts are not bit-exact.

``vllm-minimax-m3-kv selftest`` runs it by hand and can write a replay file
(inputs, bytes, scores, top-k) that ``--replay`` runs again, bit for bit, on
another machine, Triton's interpreter included
(``vllm_minimax_m3_kv/entrypoints/selftest.py``, ``tests/kernels/``).
"""

from __future__ import annotations

import math
import os
import threading
from dataclasses import dataclass, field
from typing import Any

from vllm_minimax_m3_kv.envs import SKIP_SELFTEST_ENV, skip_selftest_from_env

E4M3_MAX = 448.0
SPARSE_BLOCK = 128
WRITER_NOT_RUN = (
    "writer: not run (vLLM's fused index-K insert is a GPU op; its e4m3 bytes "
    "are taken from its source: saturating, single-rounded)"
)
WRITER_NOT_RUN_ON_CPU = (
    "writer: not run (Triton's interpreter casts to fp8 inexactly; the "
    "plugin's fnuz writer is checked on a GPU)"
)


@dataclass(frozen=True)
class Fp8Format:
    """The fp8 e4m3 type the index cache is stored in, and vLLM's clamp."""

    dtype: str = "float8_e4m3fn"
    max: float = E4M3_MAX

    @property
    def torch_dtype(self) -> Any:
        import torch

        return getattr(torch, self.dtype)


E4M3FN = Fp8Format()
E4M3FNUZ = Fp8Format("float8_e4m3fnuz", 224.0)
"""vLLM clamps fnuz to 224, not torch's 240 (``get_fp8_min_max``)."""


def platform_fp8() -> Fp8Format:
    """The platform's fp8 format as vLLM stores the main cache (fnuz on gfx942)."""
    from vllm.platforms import current_platform

    return E4M3FNUZ if current_platform.is_fp8_fnuz() else E4M3FN


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
    writer: str = WRITER_NOT_RUN
    """What the writer half found, or why it did not run."""

    @property
    def passed(self) -> bool:
        return not self.failures and self.checked > 0


class SelftestFailed(RuntimeError):
    """The fp8 indexer's scorers did not hold on this GPU: do not serve."""


def e4m3(values: Any, fmt: Fp8Format = E4M3FN) -> Any:
    """fp32 values as the index writer stores them: clamped, one rounding."""
    return values.float().clamp(-fmt.max, fmt.max).to(fmt.torch_dtype)


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


def run_selftest(
    case: Case | None = None, device: str | None = None, fmt: Fp8Format | None = None
) -> Result:
    """Run the scorers on this device in fp8 and bf16, and judge them; then
    the writer half where it can run."""
    import torch

    case = case or Case()
    device = device or kernel_device()
    fmt = fmt or platform_fp8()
    inputs = make_inputs(case)
    stored = {name: e4m3(value, fmt) for name, value in inputs.items()}
    # Model construction sets a meta default device; these are real tensors.
    with torch.device("cpu"):
        fp8 = run_scorers(case, *stored.values(), device=device)
        as_bf16 = [value.to(torch.bfloat16) for value in stored.values()]
        bf16 = run_scorers(case, *as_bf16, device=device)
        ref = reference_scores(case, stored["keys"].float(), stored["prefill_q"])
        result = judge(case, fp8, bf16, ref)
    result.record = {
        "case": case.__dict__,
        "fp8": fmt.dtype,
        "device": _device_name(device),
        "bytes": {name: value.view(torch.uint8) for name, value in stored.items()},
        "outputs": fp8,
    }
    result.writer = check_writer(result, device, fmt)
    return result


WRITER_TOKENS = 256
WRITER_OUTLIERS = (1000.0, -1000.0, 224.0, -224.0, 225.0, 239.9, -3e4)
"""Past, at and just over vLLM's fnuz range: each must be stored as +-224."""


def writer_inputs(fmt: Fp8Format, seed: int = 0) -> dict[str, Any]:
    """Index keys and queries as the fused op leaves them (bf16, normed),
    some past the fp8 range, and a slot mapping with padded (-1) slots."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    keys = _rms_normed(generator, WRITER_TOKENS, 128)
    queries = _rms_normed(generator, WRITER_TOKENS, 256)
    for i, value in enumerate(WRITER_OUTLIERS):
        keys[3 * i + 1, i] = value
        queries[5 * i + 2, 2 * i] = value
    slots = torch.randperm(4 * SPARSE_BLOCK, generator=generator)[:WRITER_TOKENS]
    slots[::17] = -1  # padded tokens (CUDA-graph padding): nothing stored
    return {
        "keys": keys.to(torch.bfloat16),
        "queries": queries.to(torch.bfloat16),
        "slots": slots,
    }


STALE_MARK = 0x80
"""What the cache holds before the write: fnuz NaN, so a byte the writer
should have left alone, or written, shows."""


def run_writer(inputs: dict[str, Any], fmt: Fp8Format, device: str) -> dict[str, Any]:
    """The plugin's fnuz writer on ``device``: the cache (4 blocks) and the
    query buffer it fills."""
    import torch

    from vllm_minimax_m3_kv.model_executor.models.minimax_m3_rocm_fnuz_index_writer import (
        clamp_cast_index,
    )

    cache = torch.full(
        (4, SPARSE_BLOCK, 128), STALE_MARK, dtype=torch.uint8, device=device
    ).view(fmt.torch_dtype)
    query_out = torch.empty(
        inputs["queries"].shape, dtype=fmt.torch_dtype, device=device
    )
    clamp_cast_index(
        inputs["keys"].to(device),
        inputs["queries"].to(device),
        cache,
        query_out,
        inputs["slots"].to(device),
        fmt.max,
    )
    return {"cache": cache.cpu(), "queries": query_out.cpu()}


def judge_writer(
    inputs: dict[str, Any], written: dict[str, Any], fmt: Fp8Format
) -> list[str]:
    """The writer's bytes against torch's clamp-and-cast of the same values;
    slots no token maps to left as they were."""
    import torch

    failures = []
    slots = inputs["slots"]
    kept = slots >= 0
    cache = written["cache"].view(torch.uint8).view(-1, 128)
    want_keys = e4m3(inputs["keys"], fmt).view(torch.uint8)
    off = (cache[slots[kept]] != want_keys[kept]).sum()
    if off:
        failures.append(f"writer: {int(off)} index-key bytes differ from torch's cast")
    untouched = torch.ones(cache.shape[0], dtype=torch.bool)
    untouched[slots[kept]] = False
    if (cache[untouched] != STALE_MARK).any():
        failures.append("writer: bytes changed in slots no token maps to")
    want_queries = e4m3(inputs["queries"], fmt).view(torch.uint8)
    off = (written["queries"].view(torch.uint8) != want_queries).sum()
    if off:
        failures.append(
            f"writer: {int(off)} index-query bytes differ from torch's cast"
        )
    return failures


def check_writer(result: Result, device: str, fmt: Fp8Format) -> str:
    """The writer half, where it runs; returns its verdict clause."""
    if fmt != E4M3FNUZ:
        return WRITER_NOT_RUN
    if device == "cpu":
        return WRITER_NOT_RUN_ON_CPU
    inputs = writer_inputs(fmt)
    failures = judge_writer(inputs, run_writer(inputs, fmt, device), fmt)
    result.failures += failures
    result.checked += 1
    largest = max(
        float(inputs[name].float().abs().max()) for name in ("keys", "queries")
    )
    clamped = sum(
        int((inputs[name].float().abs() > fmt.max).sum())
        for name in ("keys", "queries")
    )
    verdict = "as torch's clamp-and-cast" if not failures else "WRONG"
    return (
        f"writer: the plugin's fnuz index writer {verdict} ({clamped} synthetic "
        f"outliers up to {largest:g} clamped to +-{fmt.max:g})"
    )


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
            f"selftest passed on {result.record.get('device')}: "
            f"{result.record.get('fp8', 'fp8')} index scores within one ulp of "
            f"fp64, top-k as bf16, planted blocks kept ({result.checked} checks); "
            f"{result.writer}"
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
        "This GPU does not reproduce the fp8 index cache; do not serve an fp8 "
        "index cache here.\nFix with one of:\n  " + "\n  ".join(FAILURE_FIXES)
    )


def run_node_selftest() -> Result:
    """The self-test on this process's GPU (not run without one)."""
    import torch

    if not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1":
        return Result(failures=["not run: no GPU in this process"])
    return run_selftest()
