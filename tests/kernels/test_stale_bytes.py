"""No zeroer is needed: vLLM's MiniMax-M3 kernels never let a KV slot that
was not written reach a result.

Every byte of the bound pool is filled with a stale pattern (zeros, 0xFF,
the largest finite value of the dtype each kernel reads, random bytes), one
request whose length is not a multiple of the 128-token block is written, and
vLLM's prefill and decode indexer and sparse-attention kernels run on it
(``tests/kernels/stale_bytes.py``: Triton's interpreter on CPU, natively on a
CUDA GPU). Their outputs, and the prefill scores of the request's own blocks,
must be bit-identical whatever the pattern. The witness claims one unwritten
slot and must see it. AITER's MSA kernels (HIP) are not run here.
"""

from __future__ import annotations

import pytest

from sim.kernels import kernel_env
from sim.process import json_from_out_file

CHILD = ["-m", "tests.kernels.stale_bytes"]
PLUGIN_EXCLUDED = {"VLLM_PLUGINS": "lora_filesystem_resolver"}
OUTPUTS = {"prefill_score", "prefill_topk", "prefill_out", "decode_topk", "decode_out"}


@pytest.fixture(scope="module")
def plugin_pool() -> dict:
    return json_from_out_file([*CHILD, "--with-witness"], kernel_env(), timeout=1800)


def test_the_plugins_uniform_pool_needs_no_zeroer(plugin_pool):
    assert plugin_pool["index_spec"] == plugin_pool["main_spec"]
    assert plugin_pool["zeroing"] is False
    assert set(plugin_pool["lengths"]) == {"2049", "2112"}  # +1 slot, +half a block
    for length, result in plugin_pool["lengths"].items():
        assert result["identical"] == dict.fromkeys(OUTPUTS, True), length
        assert all(result["finite_out"].values()), (length, result["finite_out"])


def test_a_request_that_claims_an_unwritten_slot_sees_it(plugin_pool):
    """The witness: the same comparison must fail when a stale slot is read."""
    witness = plugin_pool["witness"]["identical"]
    # One stale key among 2,049 moves the scores and both attention outputs.
    assert not witness["prefill_score"], witness
    assert not witness["prefill_out"] and not witness["decode_out"], witness


def test_the_stock_mixed_pool_under_the_same_test(matrix_size):
    """What stock vLLM's mixed pool (bf16 index cache) does: the same. Its
    failure is the zeroing disagreement under PP (vLLM PR #64472), not stale
    bytes in these kernels. Runs at --matrix=full (CI's second step)."""
    if matrix_size != "full":
        pytest.skip("runs at --matrix=full (.ci/run's full-size step)")
    stock = json_from_out_file(CHILD, {**kernel_env(), **PLUGIN_EXCLUDED}, 1800)
    assert stock["index_spec"] == ["torch.bfloat16", "NONE"]
    assert stock["zeroing"] is True
    for length, result in stock["lengths"].items():
        print(f"stock mixed pool, {length} tokens: {result}")
        assert result["identical"] == dict.fromkeys(OUTPUTS, True), length
