"""The node self-test's judge: the scorers' outputs against fp64 on the same
bytes, nothing relative (:mod:`vllm_minimax_m3_kv.selftest` makes the batch
and runs the kernels).

* prefill scores within ``2**-SCORE_BOUND_BITS`` of sum_i |q_i k_i| (the
  block's largest over its visible keys) of the fp64 reference. Matrix
  units add the exact e4m3 products with fewer bits than fp32: Hopper's fp8
  MMA keeps about 14, and an H200 was off by up to 0.097 (over 1,000 fp32
  ulps) where fp32 sums are exact (docs/what-ran-where.md). A wrong fp8
  flavour (a factor of two), a misread byte or a stale slot misses the bound
  by far;
* a score that is not finite where fp64's is (NaN, +-inf) fails by name: a
  NaN compares false with any bound, so "off by more than the bound" alone
  would pass it;
* every top-k, prefill and both decode paths, the blocks the fp64 scores
  select under vLLM's rule (the query's own last block forced in, then the
  best scores), blocks whose scores are within their bounds of the cut
  aside; an index outside the request's visible blocks, or twice in a row,
  fails by name;
* every planted block selected.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from vllm_minimax_m3_kv.selftest import (
    HOST,
    SCORE_BOUND_BITS,
    SPARSE_BLOCK,
    Case,
    Result,
)

TOPK_OUTPUTS = ("prefill_topk", "decode_topk_q1", "decode_topk_q2")


def _block_scores(
    case: Case, keys: Any, queries: Any, rows: list[tuple[int, int]]
) -> tuple[Any, Any]:
    """fp64 scores, ``[rows, blocks]`` (the widest sequence's blocks): per
    query row, the max over each block of its sequence of the causally
    visible keys' q.k (-inf where none is visible, and past the sequence's
    end); and each score's bound: ``2**-SCORE_BOUND_BITS`` of the block's
    largest sum_i |q_i k_i| over the same keys (0 where none is visible)."""
    import torch

    width = max(case.blocks_of(s) for s, _ in rows)
    scores = torch.full((len(rows), width), -math.inf, dtype=torch.float64)
    bounds = torch.zeros((len(rows), width), dtype=torch.float64)
    for row, (sequence, position) in enumerate(rows):
        first, count = case.first_block(sequence), case.blocks_of(sequence)
        k = keys[first * SPARSE_BLOCK : (first + count) * SPARSE_BLOCK].double()
        q = queries[row].double()
        visible = torch.arange(count * SPARSE_BLOCK, device=HOST) <= position
        dots = (k @ q).masked_fill(~visible, -math.inf)
        magnitudes = (k.abs() @ q.abs()).masked_fill(~visible, 0.0)
        scores[row, :count] = dots.view(count, SPARSE_BLOCK).amax(-1)
        bounds[row, :count] = magnitudes.view(count, SPARSE_BLOCK).amax(-1)
    return scores, bounds * 2.0**-SCORE_BOUND_BITS


def reference_scores(case: Case, keys: Any, prefill_q: Any) -> tuple[Any, Any]:
    """fp64 prefill scores on the stored values and their bounds, shaped as
    the kernel's scores."""
    scores, bounds = _block_scores(case, keys, prefill_q, case.rows("prefill_score"))
    return scores[None], bounds[None]


@dataclass(frozen=True)
class Selection:
    """The blocks vLLM's rule selects for one query, from fp64 scores."""

    blocks: frozenset[int]
    tied: frozenset[int] = frozenset()
    """Blocks within their bounds of the cut: a kernel may pick any of them."""
    visible: int = 0
    """Blocks the query can see: a selected index must be below it."""

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
        return Selection(frozenset(forced | set(chosen)), visible=visible)
    last = chosen[-1]

    def near_cut(block: int) -> bool:
        return abs(scores[block] - scores[last]) <= bounds[block] + bounds[last]

    tied = {b for b in ranked if near_cut(b)} if near_cut(rest[0]) else set()
    return Selection(frozenset(forced | set(chosen)), frozenset(tied), visible)


def selected(topk_row: Any) -> set[int]:
    return {int(b) for b in topk_row.tolist() if b >= 0}


def references(case: Case, stored: dict[str, Any]) -> dict[str, Any]:
    """fp64 references on the stored values: prefill scores and their
    bounds, and for every top-k output the selection per query row."""
    keys = stored["keys"].float()
    scores, bounds = reference_scores(case, keys, stored["prefill_q"].float())
    refs: dict[str, Any] = {"prefill_score": scores, "prefill_bound": bounds}
    for name in TOPK_OUTPUTS:
        rows = case.rows(name)
        queries = stored["prefill_q" if name == "prefill_topk" else "decode_q"]
        scores, bounds = _block_scores(case, keys, queries[: len(rows)].float(), rows)
        refs[name] = [
            reference_selection(case, row.tolist(), bound.tolist(), position)
            for row, bound, (_, position) in zip(scores, bounds, rows, strict=True)
        ]
    return refs


def judge(case: Case, outputs: dict[str, Any], refs: dict[str, Any]) -> Result:
    """The verdict on one run: scores and every top-k against fp64, planted
    blocks kept. ``record["score_error"]``: the worst score's distance from
    fp64 as a fraction of its bound (inf where a score is not finite)."""
    result = Result()
    _judge_scores(outputs["prefill_score"], refs, result)
    for name in TOPK_OUTPUTS:
        rows = outputs[name].reshape(-1, case.topk)
        sequences = [sequence for sequence, _ in case.rows(name)]
        for row, (got, want) in enumerate(zip(rows, refs[name], strict=True)):
            result.checked += 1
            entries = [int(b) for b in got.tolist()]
            picked = selected(got)
            outside = sorted(b for b in picked if b >= want.visible)
            if outside:
                result.failures.append(
                    f"{name} row {row}: picked blocks {outside}, past the "
                    f"{want.visible} it can see"
                )
            if len(picked) != sum(b >= 0 for b in entries):
                result.failures.append(f"{name} row {row}: a block picked twice")
            if not want.admits(picked):
                result.failures.append(
                    f"{name} row {row}: picked {sorted(picked)}, fp64 selects "
                    f"{sorted(want.blocks)}"
                )
            missing = set(case.planted_in(sequences[row])) - picked
            if missing:
                result.failures.append(
                    f"{name} row {row}: planted blocks {sorted(missing)} not selected"
                )
    return result


def _judge_scores(score: Any, refs: dict[str, Any], result: Result) -> None:
    import torch

    score, ref, bound = score.double(), refs["prefill_score"], refs["prefill_bound"]
    result.checked += score.numel()
    if score.shape != ref.shape:
        result.record["score_error"] = math.inf
        result.failures.append(
            f"prefill scores: shape {tuple(score.shape)}, fp64 has {tuple(ref.shape)}"
        )
        return
    both_inf = torch.isinf(score) & torch.isinf(ref) & (score.sign() == ref.sign())
    unsound = ~torch.isfinite(score) & ~both_inf
    error = (score - ref).abs().masked_fill(both_inf, 0.0)
    # Written so that NaN is off: NaN <= bound is false.
    off = ~(error <= bound)
    worst = error.masked_fill(unsound, 0.0)
    ratio = (worst / bound.clamp_min(torch.finfo(torch.float64).tiny)).max()
    result.record["score_error"] = math.inf if unsound.any() else float(ratio)
    if unsound.any():
        kinds = ", ".join(
            f"{int(count)} {kind}"
            for kind, count in (
                ("NaN", torch.isnan(score).sum()),
                ("inf", (torch.isinf(score) & ~both_inf).sum()),
            )
            if count
        )
        result.failures.append(
            f"prefill scores: {int(unsound.sum())} of {score.numel()} not finite "
            f"where fp64 is finite or the other infinity ({kinds})"
        )
    off &= ~unsound
    if off.any():
        result.failures.append(
            f"prefill scores: {int(off.sum())} of {score.numel()} off the fp64 "
            f"reference by more than 2^-{SCORE_BOUND_BITS} of sum|q*k| (worst "
            f"{float(worst.max()):.3g}, {float(ratio):.3g} times its bound)"
        )
