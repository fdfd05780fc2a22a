"""Who zeroes KV blocks under today's public recipes (``zeroing.py``), and the
table docs/reliability.md shows is that command's output."""

from __future__ import annotations

import pytest

from sim.process import REPO
from tests.reliability.zeroing import facts, render


@pytest.fixture(scope="module")
def rows():
    return facts()


@pytest.mark.slow
def test_stock_vllm_never_zeroes_a_block_under_todays_public_recipes(rows):
    # Workers build a zeroer, the scheduler never asks it: every kernel these
    # recipes select already runs over blocks nobody zeroes.
    stock = [row for row in rows if not row["plugin"]]
    assert len(stock) == 3 and not any(row["error"] for row in stock)
    for row in stock:
        assert row["pp1"]["workers"] == [True] and row["pp1"]["scheduler"] is False
        assert row["pp2"]["workers"] == [False, True]
        assert row["pp2"]["scheduler"] is False
    kernels = {row["recipe"]: (row["gpu"], row["indexer_impls"]) for row in stock}
    assert kernels["public B300 recipe"] == ("b300", ["MiniMaxM3IndexerMSAImpl"])
    assert kernels["public MI355X recipe (AITER off)"][1] == [
        "MiniMaxM3IndexerTritonImpl"
    ]


@pytest.mark.slow
def test_with_the_plugin_no_worker_builds_a_zeroer_where_it_starts(rows):
    for row in (row for row in rows if row["plugin"]):
        if row["error"]:
            assert row["recipe"] == "public MI355X recipe (AITER off)"
            assert row["error"]["from_plugin"]
            continue
        for split in ("pp1", "pp2"):
            assert not any(row[split]["workers"]) and not row[split]["scheduler"]


@pytest.mark.slow
def test_the_docs_show_this_commands_table(rows):
    doc = (REPO / "docs" / "reliability.md").read_text()
    assert render(rows) in doc, "python -m tests.reliability.zeroing"
