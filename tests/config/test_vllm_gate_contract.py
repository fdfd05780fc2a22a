"""The policy's "does an fp8 indexer run here" equals vLLM 0.33's own gates.

vLLM's gates read the live platform, so the offline ``check`` cannot call them
for another machine; the policy restates them. This pins the restatement to
``msa_indexer_unsupported_reason`` and ``select_indexer_impl_cls`` (with the
plugin's gate entry loaded) over AITER flags, checkpoint shapes and context
lengths, per simulated GPU.
"""

from __future__ import annotations

import pytest

from vllm_minimax_m3_kv_sim.plumbing.children import json_from_stdout


@pytest.mark.parametrize("platform", ["mi355x", "mi300x", "mi250x", "b300", "h200"])
def test_policy_matches_vllm_gates(platform):
    rows = json_from_stdout(
        ["-m", "vllm_minimax_m3_kv_sim.programs.gate_contract", platform]
    )
    assert len(rows) == 60
    disagreements = [case for case, vllm, policy, _ in rows if vllm != policy]
    assert disagreements == []
    if platform == "mi355x":
        # With the plugin an fp8 indexer runs wherever AITER's MSA one does
        # (stock's only one) and, AITER sparse PA off, the Triton one; beside
        # AITER sparse PA the Triton one would read bytes nothing checks.
        for case, vllm, _, stock in rows:
            assert vllm == (stock or case["aiter"] + case["shuffle"] != "11"), case
        assert {stock for *_, stock in rows} == {True, False}
        assert not all(vllm for _, vllm, _, _ in rows)
    if platform == "mi300x":
        # gfx942: the plugin's Triton fp8 indexer (fnuz) wherever AITER sparse
        # PA is off (beside it AITER's kernels would write the index cache);
        # stock vLLM has no fp8 indexer there at all.
        for case, vllm, _, _ in rows:
            assert vllm == (case["aiter"] + case["shuffle"] != "11"), case
        assert not any(stock for *_, stock in rows)
    if platform == "mi250x":
        assert not any(vllm or stock for _, vllm, _, stock in rows)
