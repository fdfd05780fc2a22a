"""The plugin's fnuz index writer on MI300X (gfx942), under Triton's interpreter.

The child (``tests/kernels/rocm_fnuz_writer.py``) runs the writer kernel for
real on CPU tensors; what it cannot show here, the exact fnuz bytes of the
cast, the node self-test checks on a GPU (``selftest``'s writer half).
"""

from __future__ import annotations

import pytest

from vllm_minimax_m3_kv_sim.kernels import kernel_env
from vllm_minimax_m3_kv_sim.plumbing.children import json_from_out_file

CHILD = ["-m", "tests.kernels.rocm_fnuz_writer"]


def _child(*args: str) -> dict:
    return json_from_out_file([*CHILD, *args], kernel_env(), timeout=900)


@pytest.fixture(scope="module")
def writer() -> dict:
    return _child()


def test_keys_land_in_their_slots_and_padded_tokens_write_nothing(writer):
    kernel = writer["kernel"]
    assert kernel["dtype"] == "torch.float8_e4m3fnuz"
    # Exactly the slots the mapping names change; 1 in 17 tokens is padding.
    assert kernel["changed_slots"] == kernel["mapped_slots"]
    assert 200 < len(kernel["mapped_slots"]) < 256


def test_values_past_vllms_fnuz_range_are_stored_as_224(writer):
    kernel = writer["kernel"]
    assert kernel["fnuz_max"] == 224.0
    assert kernel["outliers_at_224"]
    assert kernel["values_close"]


def test_nan_is_stored_as_nan_as_torchs_clamp_and_cast_stores_it(writer):
    # tl.maximum/tl.minimum return the bound for a NaN operand: without its
    # NaN guard the writer stored a NaN key as -224 (0xfe), torch as NaN.
    kernel = writer["kernel"]
    assert kernel["nan_inputs"] == 2
    assert kernel["nan_stays_nan"]


def test_without_the_clamp_the_outliers_are_not_224():
    # The check above can fail: torch's and Triton's fnuz casts do not
    # saturate (fnuz has no infinity; overflow is NaN or wraps).
    kernel = _child("--mutant", "no_clamp", "--only", "kernel")["kernel"]
    assert not kernel["outliers_at_224"]


def test_an_fnuz_index_cache_takes_three_launches_and_nothing_else_changes(writer):
    routing = writer["routing"]
    assert routing["ops_wrapped"] and routing["other_ops_pass_through"]
    main, index = routing["fnuz_calls"]
    # 1. vLLM's reuse-layer call: main norm, RoPE and K/V insert, no index work.
    assert main["skip_index_branch"] is True
    assert main["kv_cache"] and main["slot_mapping"] and main["q_out"]
    assert "index_cache" not in main and "index_q_out" not in main
    # 2. vLLM's cache-free call: index norm and RoPE, index query in bf16.
    assert index["index_q_out"] == "torch.bfloat16"
    assert "kv_cache" not in index and "index_cache" not in index
    # 3. The plugin's kernel stored the index key (from qkv's last 128 columns)
    # at its slots and the op's index query, both fnuz.
    assert routing["keys_at_slots"] and routing["other_slots_zero"]
    assert routing["index_q_is_the_ops_query"]


def test_a_bf16_index_cache_calls_vllms_op_once_unchanged(writer):
    (call,) = writer["routing"]["bf16_calls"]
    assert call["index_cache"] == "torch.bfloat16"
    assert "skip_index_branch" not in call
