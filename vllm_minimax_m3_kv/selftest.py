"""The node self-test: vLLM's indexer scorers on an fp8 index cache, on this GPU.

Before the plugin lets vLLM's Triton indexer read an fp8 index cache on ROCm
(``minimax_m3_rocm_fp8_triton_indexer``), each worker process runs this once
(:mod:`vllm_minimax_m3_kv.selftest_gate` says when and where): the scorers
vLLM's indexer module imports on this platform (prefill score and top-k,
decode at query length 1 and 2), on synthetic RMS-normed keys and queries with
planted winners, stored in the platform's fp8 e4m3 type the way the writer
stores them (clamped to vLLM's range, one rounding: e4m3fn +-448 on gfx950,
e4m3fnuz +-224 on gfx942), and judged against fp64 on the same bytes
(:mod:`vllm_minimax_m3_kv.selftest_judge`).

The inputs are shaped like a serving batch, not one request: four sequences of
distinct lengths (a full last block, partial ones, one token short of a
block), each in its own permuted, non-contiguous pages of one paged cache;
two prefill requests and three decode requests, each reading its own block
table and length, decode at query length 1 and 2 (the MTP rows); planted
blocks that differ per sequence, so a request that reads another's table or
length picks the wrong blocks. The stored bytes carry the e4m3fn byte 0x80
(-0, NaN in e4m3fnuz) in every query and planted key, and both exponent
extremes (the clamp's largest value and the smallest subnormal), so a writer
and a reader that disagree on the fp8 flavour give non-finite or misplaced
scores. One flavour mismatch has no effect a test could see, nor one serving
could: e4m3fnuz bytes read as e4m3fn are exactly twice their value for every
byte vLLM's fnuz clamp writes, so decode's top-k is unchanged (the prefill
score, judged absolutely, still shows it).

It runs in a context of its own: vLLM calls it inside its model build (a GPU
default device, bf16 default dtype), so every tensor is placed and typed
explicitly, and the autotuner choices its toy problem makes are put back, in
memory and on disk, so serving tunes on its own shapes. Only fp8 kernels run
(no bf16 variant is compiled for a dtype serving never uses).

The writer half, on gfx942: the plugin's fnuz index writer
(``minimax_m3_rocm_fnuz_index_writer``) on this GPU (:mod:`.selftest_writer`).
On gfx950 the writer is vLLM's fused op (a HIP op this test does not call): its
bytes are taken from its source (saturating, single-rounded), and the verdict
says so. Under Triton's interpreter (CPU) the writer half does not run: the
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
from dataclasses import asdict, dataclass, field
from itertools import accumulate
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
NEGATIVE_ZERO = -1e-4
"""Rounds to -0: e4m3fn's byte 0x80, which e4m3fnuz reads as NaN."""
PLANTED_TOKEN = 37
"""The token of each planted block that holds the planted key."""


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
    """The synthetic batch the scorers run on: sequences in one paged cache,
    and the prefill and decode requests that read them."""

    lengths: tuple[int, ...] = (
        24 * SPARSE_BLOCK - 50,
        19 * SPARSE_BLOCK - 1,
        21 * SPARSE_BLOCK,
        18 * SPARSE_BLOCK - 77,
    )
    """Each sequence's length in tokens. Slots past a sequence's end hold
    whatever the cache held (stale bytes), which no score may read."""
    prefill: tuple[tuple[int, int], ...] = ((0, 4), (1, 3))
    """Prefill requests: (sequence, query rows at its end)."""
    decode: tuple[int, ...] = (2, 0, 3)
    """Decode requests, by sequence; query length 1 and 2 each."""
    planted: tuple[int, ...] = (2, 9, 14)
    """Blocks ``b + s`` of sequence ``s`` hold one key aligned with every
    query: always selected, and different in every sequence."""
    index_dim: int = 128
    topk: int = 16
    init_blocks: int = 0
    local_blocks: int = 1
    marked: bool = True
    """The stored bytes carry -0 (0x80) and both exponent extremes."""
    seed: int = 0

    @classmethod
    def single(
        cls,
        blocks: int = 24,
        short_tail: int = 50,
        prefill_queries: int = 4,
        decode_requests: int = 3,
        **fields: Any,
    ) -> Case:
        """One sequence that every request reads (the benchmarks' haystack;
        the self-test's shape before it was widened), unmarked."""
        return cls(
            lengths=(blocks * SPARSE_BLOCK - short_tail,),
            prefill=((0, prefill_queries),),
            decode=(0,) * decode_requests,
            **{"planted": (2, 9, 17), "marked": False, **fields},
        )

    @classmethod
    def from_record(cls, fields: dict[str, Any]) -> Case:
        """The case a record was made on (a record from before the batch was
        widened names ``blocks`` and ``short_tail``: one shared sequence)."""
        if "lengths" not in fields:
            return cls.single(**_tuples(fields))
        return cls(**_tuples(fields))

    def to_record(self) -> dict[str, Any]:
        return asdict(self)

    def blocks_of(self, sequence: int) -> int:
        return math.ceil(self.lengths[sequence] / SPARSE_BLOCK)

    @property
    def blocks(self) -> int:
        """Blocks of the first sequence (the one-sequence cases' length)."""
        return self.blocks_of(0)

    @property
    def total_blocks(self) -> int:
        return sum(self.blocks_of(s) for s in range(len(self.lengths)))

    def first_block(self, sequence: int) -> int:
        """Where the sequence's keys start in ``make_inputs``' keys, in blocks."""
        return sum(self.blocks_of(s) for s in range(sequence))

    def planted_in(self, sequence: int) -> tuple[int, ...]:
        return tuple(block + sequence for block in self.planted)

    def requests(self, name: str) -> list[int]:
        """The sequence each request of an output reads."""
        if name in ("prefill_score", "prefill_topk"):
            return [sequence for sequence, _ in self.prefill]
        return list(self.decode)

    def rows(self, name: str) -> list[tuple[int, int]]:
        """Each query row of an output: (sequence, position), as
        ``run_scorers`` lays the rows out (prefill: each request's last
        tokens; decode: ``query_len`` rows per request, request-major)."""
        if name in ("prefill_score", "prefill_topk"):
            return [
                (s, self.lengths[s] - n + i) for s, n in self.prefill for i in range(n)
            ]
        query_len = int(name.removeprefix("decode_topk_q"))
        return [
            (s, self.lengths[s] - query_len + j)
            for s in self.decode
            for j in range(query_len)
        ]

    def query_positions(self, name: str) -> list[int]:
        return [position for _, position in self.rows(name)]

    @property
    def prefill_rows(self) -> int:
        return sum(n for _, n in self.prefill)


def _tuples(fields: dict[str, Any]) -> dict[str, Any]:
    """A record's lists back into the case's tuples."""

    def tupled(value: Any) -> Any:
        return tuple(tupled(v) for v in value) if isinstance(value, list) else value

    return {name: tupled(value) for name, value in fields.items()}


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
    """Keys of every sequence (whole blocks, one after another), prefill and
    decode queries (fp32, before storage), planted and marked."""
    generator = _generator(case.seed)
    dim = case.index_dim
    # Whole blocks: each last block's tail is generated but never stored.
    keys = _rms_normed(generator, case.total_blocks * SPARSE_BLOCK, dim)
    prefill_q = _rms_normed(generator, case.prefill_rows, dim)
    decode_q = _rms_normed(generator, len(case.decode) * 2, dim)
    direction = _rms_normed(generator, 1, dim)[0]
    # Queries lean towards one direction; one key in each planted block is it,
    # scaled up, so that block's max score wins by far.
    prefill_q = (prefill_q + 2 * direction) / 3
    decode_q = (decode_q + 2 * direction) / 3
    for sequence in range(len(case.lengths)):
        first = case.first_block(sequence)
        for block in case.planted_in(sequence):
            keys[(first + block) * SPARSE_BLOCK + PLANTED_TOKEN] = 3 * direction
        if case.marked:
            _mark(keys, first, case.planted_in(sequence)[0])
    if case.marked:
        prefill_q[:, 1] = NEGATIVE_ZERO
        decode_q[:, 1] = NEGATIVE_ZERO
    return {"keys": keys, "prefill_q": prefill_q, "decode_q": decode_q}


def _mark(keys: Any, first: int, planted: int) -> None:
    """Flavour marks in one sequence: -0 in a planted key's first channel
    (a reader taking e4m3fn for e4m3fnuz sees NaN there), and in block 1 a key
    at both exponent extremes (past the clamp either way, and the smallest
    subnormal)."""
    keys[(first + planted) * SPARSE_BLOCK + PLANTED_TOKEN, 0] = NEGATIVE_ZERO
    extreme = (first + 1) * SPARSE_BLOCK + 5
    keys[extreme, 0:4] = keys.new_tensor([1000.0, -1000.0, 2.0**-9, -(2.0**-9)])


def _paged(
    case: Case, keys: Any, device: str, stale: int | None = None
) -> tuple[Any, Any]:
    """Every sequence's keys in one paged cache (pages permuted over all
    sequences, one spare) and the block table of each sequence. Slots no
    token fills (the spare page, each last block's tail) hold zeros, or the
    byte ``stale`` in every byte, as a reused block would."""
    import torch

    total = case.total_blocks
    pages = torch.randperm(total + 1, generator=_generator(case.seed + 1), device=HOST)
    shape = (total + 1, SPARSE_BLOCK, case.index_dim)
    raw = torch.full(
        (math.prod(shape) * keys.element_size(),),
        stale or 0,
        dtype=torch.uint8,
        device=HOST,
    )
    cache = raw.view(keys.dtype).view(shape)
    blocks = keys.view(total, SPARSE_BLOCK, case.index_dim)
    width = max(case.blocks_of(s) for s in range(len(case.lengths)))
    tables = torch.zeros(len(case.lengths), width, dtype=torch.int32, device=HOST)
    for sequence, length in enumerate(case.lengths):
        first, count = case.first_block(sequence), case.blocks_of(sequence)
        own = pages[first : first + count]
        tables[sequence, :count] = own.to(torch.int32)
        cache[own[:-1]] = blocks[first : first + count - 1]
        filled = length - (count - 1) * SPARSE_BLOCK
        cache[own[-1], :filled] = blocks[first + count - 1, :filled]
    return cache.to(device), tables.to(device)


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

    cache, tables = _paged(case, keys, device, stale)
    i32 = {"dtype": torch.int32, "device": device}
    sequences = case.requests("prefill_topk")
    counts = [n for _, n in case.prefill]
    lengths = [case.lengths[s] for s in sequences]
    cu_seqlens = torch.tensor([0, *accumulate(counts)], **i32)
    seq_lens = torch.tensor(lengths, **i32)
    prefix = torch.tensor(
        [length - n for length, n in zip(lengths, counts, strict=True)], **i32
    )
    table = tables[torch.tensor(sequences, device=device)].contiguous()
    q = prefill_q.to(device).view(-1, 1, case.index_dim)
    score = vllm_indexer.minimax_m3_index_score(
        q, cache, table, cu_seqlens, seq_lens, prefix, max(counts), max(lengths), 1
    )
    prefill_topk = vllm_indexer.minimax_m3_index_topk(
        score, cu_seqlens, prefix, max(counts), case.topk, case.init_blocks,
        case.local_blocks,
    )  # fmt: skip
    outputs = {
        "prefill_score": _written_scores(case, score.cpu()),
        "prefill_topk": prefill_topk.cpu(),
    }
    requests = torch.tensor(case.decode, device=device)
    tables = tables[requests].contiguous()
    lens = torch.tensor([case.lengths[s] for s in case.decode], **i32)
    longest = int(lens.max())
    for query_len in (1, 2):  # the plain decode and the spec-decode (MTP) paths
        dq = decode_q[: len(case.decode) * query_len].to(device)
        outputs[f"decode_topk_q{query_len}"] = vllm_indexer.minimax_m3_index_decode(
            dq.view(-1, 1, case.index_dim), cache, tables, lens, longest,
            case.topk, case.init_blocks, case.local_blocks, 1, query_len, 2,
        ).cpu()  # fmt: skip
    return outputs


def _written_scores(case: Case, score: Any) -> Any:
    """The prefill scores the kernel writes: each row's own blocks. Columns
    past a row's last block (the stride's padding, a shorter request's
    tail) are never written; they read -inf here, as fp64 has them."""
    width = max(case.blocks_of(s) for s in case.requests("prefill_topk"))
    score = score[..., :width].clone()
    for row, (sequence, _) in enumerate(case.rows("prefill_score")):
        score[:, row, case.blocks_of(sequence) :] = -math.inf
    return score


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
    afterwards and never written to Triton's disk cache (vLLM sets
    ``TRITON_CACHE_AUTOTUNING=1``, and the prefill top-k kernel's key is the
    same for the toy problem and serving), so serving tunes the kernels on its
    own shapes, as it would without the plugin."""
    import torch

    tuners = _autotuners(kernel_module)
    saved = [
        (t, dict(t.cache), getattr(t, "best_config", None), t.cache_results)
        for t in tuners
    ]
    default_dtype = torch.get_default_dtype()
    torch.set_default_dtype(torch.float32)
    for tuner in tuners:
        tuner.cache_results = False
    try:
        with torch.device(HOST), torch.no_grad():
            yield
    finally:
        torch.set_default_dtype(default_dtype)
        for tuner, cache, best, cache_results in saved:
            tuner.cache.clear()
            tuner.cache.update(cache)
            tuner.best_config = best
            tuner.cache_results = cache_results


def scorer_module() -> Any:
    """The module of the scorers vLLM's indexer imports on this platform."""
    from vllm.models.minimax_m3.common import indexer as vllm_indexer

    return sys.modules[vllm_indexer.minimax_m3_index_topk.__module__]


def kernel_device() -> str:
    """Where the scorers run: the GPU, or the CPU under Triton's interpreter."""
    import torch

    if os.environ.get("TRITON_INTERPRET") == "1":
        return "cpu"
    return "cuda" if torch.cuda.is_available() else "cpu"


def device_name(device: str) -> str:
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
