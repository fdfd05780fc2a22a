"""The node self-test: vLLM's indexer scorers on an fp8 index cache, on this GPU.

Before the plugin lets vLLM's Triton indexer read an fp8 index cache on ROCm
(``minimax_m3_rocm_fp8_triton_indexer``), each worker process runs this once
(:mod:`vllm_minimax_m3_kv.selftest_gate` says when and where): the scorers
vLLM's indexer module imports on this platform (prefill score and top-k,
decode at query length 1 and 2), on synthetic RMS-normed keys and queries with
planted winners, stored in the platform's fp8 e4m3 type the way the writer
stores them (clamped to vLLM's range, one rounding: e4m3fn +-448 on gfx950,
e4m3fnuz +-224 on gfx942). Judged against fp64 on the same bytes, nothing
relative:

* prefill scores within ``2**-SCORE_BOUND_BITS`` of sum_i |q_i k_i| (the
  block's largest over its visible keys) of the fp64 reference. Matrix
  units add the exact e4m3 products with fewer bits than fp32: Hopper's fp8
  MMA keeps about 14, and an H200 was off by up to 0.097 (over 1,000 fp32
  ulps) where fp32 sums are exact (docs/what-ran-where.md). A wrong fp8
  flavour (a factor of two), a misread byte or a stale slot misses the bound
  by far;
* every top-k, prefill and both decode paths, the blocks the fp64 scores
  select under vLLM's rule (the query's own last block forced in, then the
  best scores), blocks whose scores are within their bounds of the cut
  aside;
* every planted block selected.

It runs in a context of its own: vLLM calls it inside its model build (a GPU
default device, bf16 default dtype), so every tensor is placed and typed
explicitly, and the autotuner choices its toy problem makes are put back, so
serving tunes on its own shapes. Only fp8 kernels run (no bf16 variant is
compiled for a dtype serving never uses).

The writer half, on gfx942: the plugin's fnuz index writer
(``minimax_m3_rocm_fnuz_index_writer``) on this GPU, its bytes against torch's
clamp-and-cast of the same values (outliers past the range and NaN included),
padded slots untouched; it reports the largest magnitude it clamped. On gfx950
the writer is vLLM's fused op (a HIP op this test does not call): its bytes
are taken from its source (saturating, single-rounded), and the verdict says
so. Under Triton's interpreter (CPU) the writer half does not run: the
interpreter's fp8 casts are not bit-exact.

``vllm-minimax-m3-kv selftest`` runs it by hand and can write a replay file
(inputs, bytes, scores, top-k) that ``--replay`` runs again, bit for bit, on
another machine, Triton's interpreter included
(``vllm_minimax_m3_kv/entrypoints/selftest.py``, ``tests/kernels/``).
"""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

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
HOST = "cpu"
"""Where inputs are made and judged; the kernels run on the device."""
SCORE_BOUND_BITS = 8
"""A score may be off fp64 by ``2**-SCORE_BOUND_BITS`` of sum_i |q_i k_i|:
bf16's unit roundoff, loose enough for any matrix unit that accumulates with
bf16's precision or better, tight next to the defects the test is for."""


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
    """The fp8 format vLLM stores the main cache in here: as the engine's
    decision recorded it (inside a model build), else as vLLM's platform says
    (``is_fp8_fnuz``, which the decision's facts read too)."""
    from vllm.config import get_current_vllm_config_or_none
    from vllm.platforms import current_platform

    from vllm_minimax_m3_kv.config.recorded_verdict import recorded_verdict

    decided = recorded_verdict(get_current_vllm_config_or_none())
    if decided is not None:
        return E4M3FNUZ if decided.fp8_format == "e4m3fnuz" else E4M3FN
    return E4M3FNUZ if current_platform.is_fp8_fnuz() else E4M3FN


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

    def query_positions(self, name: str) -> list[int]:
        """Each query row's position in the sequence, as ``run_scorers``
        lays the rows out (prefill: the last tokens; decode: ``query_len``
        per request, request-major)."""
        if name == "prefill_topk":
            n = self.prefill_queries
            return [self.seq_len - n + i for i in range(n)]
        query_len = int(name.removeprefix("decode_topk_q"))
        return [
            self.seq_len - query_len + j
            for _ in range(self.decode_requests)
            for j in range(query_len)
        ]


@dataclass
class Result:
    """What one run of the scorers gave, and the verdict on it."""

    failures: list[str] = field(default_factory=list)
    checked: int = 0
    record: dict[str, Any] = field(default_factory=dict)
    writer: str = WRITER_NOT_RUN
    """What the writer half found, or why it did not run."""
    ran: bool = True
    """False where nothing could run (no GPU in this process)."""

    @property
    def passed(self) -> bool:
        return not self.failures and self.checked > 0


class SelftestFailed(RuntimeError):
    """The fp8 indexer's scorers did not hold on this GPU: do not serve."""


def e4m3(values: Any, fmt: Fp8Format = E4M3FN) -> Any:
    """fp32 values as the index writer stores them: clamped, one rounding
    (NaN stays NaN, as torch's clamp leaves it)."""
    return values.float().clamp(-fmt.max, fmt.max).to(fmt.torch_dtype)


def _rms_normed(generator: Any, rows: int, dim: int) -> Any:
    import torch

    x = torch.randn(rows, dim, generator=generator, dtype=torch.float32, device=HOST)
    return x / x.pow(2).mean(-1, keepdim=True).sqrt()


def _generator(seed: int) -> Any:
    import torch

    return torch.Generator(device=HOST).manual_seed(seed)


def make_inputs(case: Case) -> dict[str, Any]:
    """Keys, prefill and decode queries (fp32, before storage), planted."""
    generator = _generator(case.seed)
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

    pages = torch.randperm(
        case.blocks + 1, generator=_generator(case.seed + 1), device=HOST
    )[: case.blocks]
    shape = (case.blocks + 1, SPARSE_BLOCK, case.index_dim)
    raw = torch.full(
        (math.prod(shape) * keys.element_size(),),
        stale or 0,
        dtype=torch.uint8,
        device=HOST,
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


def _block_scores(
    case: Case, keys: Any, queries: Any, positions: list[int]
) -> tuple[Any, Any]:
    """fp64 scores, ``[queries, blocks]``: per query, the max over each
    block's causally visible keys of q.k (-inf where none is visible); and
    each score's bound: ``2**-SCORE_BOUND_BITS`` of the block's largest
    sum_i |q_i k_i| over the same keys (0 where none is visible)."""
    import torch

    k = keys.double().view(case.blocks, SPARSE_BLOCK, case.index_dim)
    dots = torch.einsum("qd,bpd->qbp", queries.double(), k)
    magnitudes = torch.einsum("qd,bpd->qbp", queries.double().abs(), k.abs())
    token = torch.arange(case.blocks * SPARSE_BLOCK, device=HOST)
    query_pos = torch.tensor(positions, device=HOST)
    visible = token.view(case.blocks, SPARSE_BLOCK)[None] <= query_pos[:, None, None]
    scores = dots.masked_fill(~visible, -math.inf).amax(-1)
    bounds = magnitudes.masked_fill(~visible, 0.0).amax(-1) * 2.0**-SCORE_BOUND_BITS
    return scores, bounds


def reference_scores(case: Case, keys: Any, prefill_q: Any) -> tuple[Any, Any]:
    """fp64 prefill scores on the stored values and their bounds, shaped as
    the kernel's scores."""
    positions = case.query_positions("prefill_topk")
    shape = (1, case.prefill_queries, case.blocks)
    scores, bounds = _block_scores(case, keys, prefill_q, positions)
    return scores.view(shape), bounds.view(shape)


@dataclass(frozen=True)
class Selection:
    """The blocks vLLM's rule selects for one query, from fp64 scores."""

    blocks: frozenset[int]
    tied: frozenset[int] = frozenset()
    """Blocks within their bounds of the cut: a kernel may pick any of them."""

    def admits(self, picked: set[int]) -> bool:
        return len(picked) == len(self.blocks) and (picked ^ self.blocks) <= self.tied


def reference_selection(
    case: Case, scores: list[float], bounds: list[float], position: int
) -> Selection:
    """vLLM's selection rule (``_topk_index_kernel``,
    ``_decode_index_score_kernel``): of the blocks visible at ``position``,
    the first ``init_blocks`` and last ``local_blocks`` always, then the best
    scores up to ``topk``. Blocks whose scores may cross the cut's within
    both bounds are ties."""
    visible = position // SPARSE_BLOCK + 1
    forced = set(range(max(0, visible - case.local_blocks), visible))
    forced |= set(range(min(case.init_blocks, visible)))
    ranked = sorted(set(range(visible)) - forced, key=lambda b: -scores[b])
    room = max(0, case.topk - len(forced))
    chosen, rest = ranked[:room], ranked[room:]
    if not chosen or not rest:
        return Selection(frozenset(forced | set(chosen)))
    last = chosen[-1]

    def near_cut(block: int) -> bool:
        return abs(scores[block] - scores[last]) <= bounds[block] + bounds[last]

    tied = {b for b in ranked if near_cut(b)} if near_cut(rest[0]) else set()
    return Selection(frozenset(forced | set(chosen)), frozenset(tied))


def _selected(topk_row: Any) -> set[int]:
    return {int(b) for b in topk_row.tolist() if b >= 0}


TOPK_OUTPUTS = ("prefill_topk", "decode_topk_q1", "decode_topk_q2")


def references(case: Case, stored: dict[str, Any]) -> dict[str, Any]:
    """fp64 references on the stored values: prefill scores and their
    bounds, and for every top-k output the selection per query row."""
    keys = stored["keys"].float()
    scores, bounds = reference_scores(case, keys, stored["prefill_q"].float())
    refs: dict[str, Any] = {"prefill_score": scores, "prefill_bound": bounds}
    for name in TOPK_OUTPUTS:
        positions = case.query_positions(name)
        queries = stored["prefill_q" if name == "prefill_topk" else "decode_q"]
        scores, bounds = _block_scores(case, keys, queries[: len(positions)], positions)
        refs[name] = [
            reference_selection(case, row.tolist(), bound.tolist(), position)
            for row, bound, position in zip(scores, bounds, positions, strict=True)
        ]
    return refs


def judge(case: Case, outputs: dict[str, Any], refs: dict[str, Any]) -> Result:
    """The verdict on one run: scores and every top-k against fp64, planted
    blocks kept. ``record["score_error"]``: the worst score's distance from
    fp64 as a fraction of its bound."""
    import torch

    result = Result()
    score, ref = outputs["prefill_score"].double(), refs["prefill_score"]
    bound = refs["prefill_bound"]
    both_inf = torch.isinf(score) & torch.isinf(ref) & (score.sign() == ref.sign())
    error = (score - ref).abs().masked_fill(both_inf, 0.0)
    off = error > bound
    result.checked += score.numel()
    ratio = (error / bound.clamp_min(torch.finfo(torch.float64).tiny)).max()
    result.record["score_error"] = float(ratio)
    if off.any():
        result.failures.append(
            f"prefill scores: {int(off.sum())} of {score.numel()} off the fp64 "
            f"reference by more than 2^-{SCORE_BOUND_BITS} of sum|q*k| (worst "
            f"{float(error.max()):.3g}, {float(ratio):.3g} times its bound)"
        )
    for name in TOPK_OUTPUTS:
        rows = outputs[name].reshape(-1, case.topk)
        for row, (got, want) in enumerate(zip(rows, refs[name], strict=True)):
            result.checked += 1
            picked = _selected(got)
            if not want.admits(picked):
                result.failures.append(
                    f"{name} row {row}: picked {sorted(picked)}, fp64 selects "
                    f"{sorted(want.blocks)}"
                )
            missing = set(case.planted) - picked
            if missing:
                result.failures.append(
                    f"{name} row {row}: planted blocks {sorted(missing)} not selected"
                )
    return result


def _autotuners(module: Any) -> list[Any]:
    """Every Triton autotuner behind the module's kernels (under heuristics)."""
    from triton.runtime.autotuner import Autotuner
    from triton.runtime.jit import KernelInterface

    found = []
    for value in vars(module).values():
        while isinstance(value, KernelInterface):
            if isinstance(value, Autotuner):
                found.append(value)
            value = getattr(value, "fn", None)
    return found


@contextmanager
def isolated_from_caller(kernel_module: Any) -> Iterator[None]:
    """Run in a context of the self-test's own, whatever the caller set.

    vLLM builds the model under a GPU default device and the model's default
    dtype: both are reset here (every tensor is also placed and typed
    explicitly). The autotuner choices the toy problem makes are put back
    afterwards, so serving tunes the kernels on its own shapes, as it would
    without the plugin."""
    import torch

    tuners = _autotuners(kernel_module)
    saved = [(t, dict(t.cache), getattr(t, "best_config", None)) for t in tuners]
    default_dtype = torch.get_default_dtype()
    torch.set_default_dtype(torch.float32)
    try:
        with torch.device(HOST), torch.no_grad():
            yield
    finally:
        torch.set_default_dtype(default_dtype)
        for tuner, cache, best in saved:
            tuner.cache.clear()
            tuner.cache.update(cache)
            tuner.best_config = best


def scorer_module() -> Any:
    """The module of the scorers vLLM's indexer imports on this platform."""
    from vllm.models.minimax_m3.common import indexer as vllm_indexer

    return sys.modules[vllm_indexer.minimax_m3_index_topk.__module__]


def run_selftest(
    case: Case | None = None, device: str | None = None, fmt: Fp8Format | None = None
) -> Result:
    """Run the scorers on this device on fp8 bytes and judge them against
    fp64 (the writer half: :mod:`.selftest_writer`)."""
    import torch

    case = case or Case()
    device = device or kernel_device()
    fmt = fmt or platform_fp8()
    with isolated_from_caller(scorer_module()):
        inputs = make_inputs(case)
        stored = {name: e4m3(value, fmt) for name, value in inputs.items()}
        outputs = run_scorers(case, *stored.values(), device=device)
        result = judge(case, outputs, references(case, stored))
        result.record |= {
            "case": case.__dict__,
            "fp8": fmt.dtype,
            "device": _device_name(device),
            "bytes": {name: value.view(torch.uint8) for name, value in stored.items()},
            "outputs": outputs,
        }
    return result


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
            f"{result.record.get('fp8', 'fp8')} index scores within "
            f"2^-{SCORE_BOUND_BITS} of sum|q*k| of fp64 (worst "
            f"{result.record.get('score_error', 0.0):.2g} of that), every top-k "
            f"as fp64 selects, planted blocks kept "
            f"({result.checked} checks); "
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
