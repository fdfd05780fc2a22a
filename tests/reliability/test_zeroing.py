"""Who zeroes KV blocks under today's public recipes (``zeroing.py``), and the
table docs/reliability.md shows is that command's output."""

from __future__ import annotations

import re

import pytest

from tests.reliability.zeroing import facts, render
from vllm_minimax_m3_kv_sim import REPO


@pytest.fixture(scope="module")
def rows():
    return facts()


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


def test_with_the_plugin_no_worker_builds_a_zeroer_where_it_starts(rows):
    # Every public recipe starts, today's MI355X one (AITER off) on vLLM's
    # Triton indexer with an fp8 index cache.
    for row in (row for row in rows if row["plugin"]):
        assert not row["error"], row
        for split in ("pp1", "pp2"):
            assert not any(row[split]["workers"]) and not row[split]["scheduler"]


def test_the_docs_show_this_commands_table(rows):
    doc = (REPO / "docs" / "reliability.md").read_text()
    assert render(rows) in doc, "python -m tests.reliability.zeroing"


FAILURE_CLAIM = re.compile(r"HTTP 500|fails? the (?:first )?request", re.IGNORECASE)
NOT_ON_0_33 = "0.33 does not have"


def test_no_doc_claims_a_failure_stock_0_33_does_not_show(rows):
    """The table: stock 0.33's scheduler never asks a stage to zero, so the
    HTTP 500 of vLLM PR #64472 (a stage asked to zero without a zeroer) does
    not occur on it. A paragraph that names that failure says so."""
    stock = [row for row in rows if not row["plugin"]]
    assert not any(row[split]["scheduler"] for row in stock for split in ("pp1", "pp2"))
    texts = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
    texts += sorted((REPO / "upstream").glob("*.md"))
    claims = []
    for path in texts:
        for paragraph in re.split(r"\n\s*\n", path.read_text(encoding="utf-8")):
            flat = " ".join(paragraph.split())
            if FAILURE_CLAIM.search(flat) and NOT_ON_0_33 not in flat:
                claims.append((path.name, flat[:160]))
    assert not claims, claims
