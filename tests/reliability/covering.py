"""A pairwise covering design: every pair of values of any two axes, in few rows.

The reliability matrix takes the full product over the axes that decide a
cell's verdict (platform, KV dtype, indexer dtype, opt-in) and this design over
the axes that shape the model and the plan (TP, PP, MTP, indexer CP,
max_model_len), so adding a value costs rows, not a product.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from typing import Any

Row = dict[str, Any]


def _pairs(row: Mapping[str, Any], names: Sequence[str]) -> set[tuple]:
    return {(a, row[a], b, row[b]) for a, b in itertools.combinations(names, 2)}


def all_pairs(axes: Mapping[str, Sequence[Any]]) -> set[tuple]:
    names = list(axes)
    return {
        (a, x, b, y)
        for a, b in itertools.combinations(names, 2)
        for x in axes[a]
        for y in axes[b]
    }


def pairwise_rows(axes: Mapping[str, Sequence[Any]]) -> list[Row]:
    """Greedy, deterministic: each row is the candidate covering most new pairs."""
    names = list(axes)
    candidates = [
        dict(zip(names, values, strict=True))
        for values in itertools.product(*(axes[name] for name in names))
    ]
    uncovered = all_pairs(axes)
    rows: list[Row] = []
    while uncovered:
        best = max(candidates, key=lambda row: len(_pairs(row, names) & uncovered))
        rows.append(best)
        uncovered -= _pairs(best, names)
    return rows


def covers_every_pair(rows: Sequence[Row], axes: Mapping[str, Sequence[Any]]) -> bool:
    covered = set().union(*(_pairs(row, list(axes)) for row in rows))
    return all_pairs(axes) <= covered
