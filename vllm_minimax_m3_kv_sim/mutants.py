"""Defects put into vLLM's scorers, for the node self-test to catch: each
one must turn its verdict red (the tests under the interpreter, the device
check on a GPU). They wrap vLLM's functions as the indexer module exports
them; the kernels themselves are left alone."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def every_request_reads_the_first() -> None:
    """vLLM's scorers handed request 0's block table and length for every
    request: a defect one shared table and length could not show."""
    from vllm.models.minimax_m3.common import indexer

    score, decode = indexer.minimax_m3_index_score, indexer.minimax_m3_index_decode

    def first(t: Any) -> Any:
        return t[:1].expand_as(t).contiguous()

    def score_first(q, cache, table, cu_seqlens, seq_lens, prefix, *args):
        return score(q, cache, first(table), cu_seqlens, seq_lens, prefix, *args)

    def decode_first(q, cache, tables, lens, *args, **kwargs):
        return decode(q, cache, first(tables), first(lens), *args, **kwargs)

    indexer.minimax_m3_index_score = score_first
    indexer.minimax_m3_index_decode = decode_first


def nan_for_the_lowest_visible_block() -> None:
    """vLLM's prefill scorer returning NaN for block 0 of every row."""
    from vllm.models.minimax_m3.common import indexer

    score = indexer.minimax_m3_index_score

    def with_nan(*args: Any) -> Any:
        out = score(*args)
        out[..., 0] = float("nan")
        return out

    indexer.minimax_m3_index_score = with_nan


KERNEL_MUTANTS: dict[str, Callable[[], None]] = {
    "shared_table": every_request_reads_the_first,
    "nan_score": nan_for_the_lowest_visible_block,
}


def restoring_the_indexer() -> Callable[[], None]:
    """Undo whatever a mutant put into vLLM's indexer module."""
    from vllm.models.minimax_m3.common import indexer

    saved = (indexer.minimax_m3_index_score, indexer.minimax_m3_index_decode)

    def restore() -> None:
        indexer.minimax_m3_index_score, indexer.minimax_m3_index_decode = saved

    return restore
