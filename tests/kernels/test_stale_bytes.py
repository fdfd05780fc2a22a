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

from vllm_minimax_m3_kv_sim.environments import STOCK_VLLM
from vllm_minimax_m3_kv_sim.kernels import kernel_env
from vllm_minimax_m3_kv_sim.plumbing.children import json_from_out_file

CHILD = ["-m", "tests.kernels.stale_bytes"]
OUTPUTS = {"prefill_score", "prefill_topk", "prefill_out", "decode_topk", "decode_out"}


JUST_PAST_A_BLOCK, MID_BLOCK = "2049", "2112"  # 16 blocks + 1 slot, + half a block


@pytest.fixture(scope="module")
def plugin_pool() -> dict:
    argv = [*CHILD, "--lengths", JUST_PAST_A_BLOCK, "--with-witness"]
    return json_from_out_file(argv, kernel_env(), timeout=1800)


def assert_no_stale_byte_reaches_a_result(pool: dict) -> None:
    for length, result in pool["lengths"].items():
        assert result["identical"] == dict.fromkeys(OUTPUTS, True), length
        assert all(result["finite_out"].values()), (length, result["finite_out"])


def test_the_plugins_uniform_pool_needs_no_zeroer(plugin_pool):
    assert plugin_pool["index_spec"] == plugin_pool["main_spec"]
    assert plugin_pool["zeroing"] is False
    assert list(plugin_pool["lengths"]) == [JUST_PAST_A_BLOCK]
    assert_no_stale_byte_reaches_a_result(plugin_pool)


def test_a_request_that_claims_an_unwritten_slot_sees_it(plugin_pool):
    """The witness: the same comparison must fail when a stale slot is read."""
    witness = plugin_pool["witness"]["identical"]
    # One stale key among 2,049 moves the scores and both attention outputs.
    assert not witness["prefill_score"], witness
    assert not witness["prefill_out"] and not witness["decode_out"], witness


def test_mid_block_and_the_stock_mixed_pool_under_the_same_test(matrix_size):
    """Half a block past the boundary on the plugin's pool, and what stock
    vLLM's mixed pool (bf16 index cache) does at both lengths: the same. Its
    failure is the zeroing disagreement under PP (vLLM PR #64472), not stale
    bytes in these kernels. Runs at --matrix=full (CI's second step): each
    pattern is a run of vLLM's kernels under the interpreter."""
    if matrix_size != "full":
        pytest.skip("runs at --matrix=full (.ci/run's full-size step)")
    ours = json_from_out_file([*CHILD, "--lengths", MID_BLOCK], kernel_env(), 1800)
    assert ours["zeroing"] is False
    assert_no_stale_byte_reaches_a_result(ours)
    both = f"{JUST_PAST_A_BLOCK},{MID_BLOCK}"
    stock = json_from_out_file(
        [*CHILD, "--lengths", both], {**kernel_env(), **STOCK_VLLM}, 1800
    )
    assert stock["index_spec"] == ["torch.bfloat16", "NONE"]
    assert stock["zeroing"] is True
    for length, result in stock["lengths"].items():
        print(f"stock mixed pool, {length} tokens: {result}")
    assert_no_stale_byte_reaches_a_result(stock)
