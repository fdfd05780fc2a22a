"""The policy's "does an fp8 indexer run here" equals vLLM 0.33's own gates.

vLLM's gates read the live platform, so the offline ``check`` cannot call them
for another machine; the policy restates them. This pins the restatement to
``msa_indexer_unsupported_reason`` (ROCm) and ``select_indexer_impl_cls`` (CUDA)
over AITER flags, checkpoint shapes and context lengths, per simulated GPU.
"""

from __future__ import annotations

import pytest

from sim.process import json_from_stdout


@pytest.mark.parametrize("platform", ["mi355x", "mi300x", "b300", "h200"])
def test_policy_matches_vllm_gates(platform):
    rows = json_from_stdout(["-m", "sim.gate_contract", platform])
    assert len(rows) == 60
    disagreements = [case for case, vllm, policy in rows if vllm != policy]
    assert disagreements == []
    if platform == "mi355x":
        # Both answers occur, so agreement is not agreement on a constant.
        assert {vllm for _, vllm, _ in rows} == {True, False}
