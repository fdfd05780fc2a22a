"""vLLM's own MiniMax-M3 kernels read the index cache the plugin describes.

The plugin describes an fp8 index cache as the main fp8 cache is described
(``uint8`` / ``FP8_PER_TENSOR``) and views it back as ``float8_e4m3fn`` when
vLLM binds it. Here a pool planned by vLLM with the plugin loaded is allocated
and bound as vLLM's worker does (``allocate_kv_cache``, ``bind_kv_cache``),
index keys and fp8 K/V are written byte for byte, and vLLM's prefill and decode
indexer kernels and sparse attention run on it: under Triton's interpreter on
CPU, natively on a CUDA GPU when there is one. Each child is one process
(``tests/kernels/pool_kernels.py``).
"""

from __future__ import annotations

import pytest

from vllm_minimax_m3_kv_sim.environments import STOCK_VLLM
from vllm_minimax_m3_kv_sim.kernels import kernel_env
from vllm_minimax_m3_kv_sim.plumbing.children import json_from_out_file

CHILD = ["-m", "tests.kernels.pool_kernels"]


@pytest.fixture(scope="module")
def plugin_pool() -> dict:
    return json_from_out_file(CHILD, kernel_env(), timeout=1800)


def test_the_plugins_pool_is_one_precision_and_bound_as_e4m3(plugin_pool):
    assert (
        plugin_pool["index_spec"]
        == plugin_pool["main_spec"]
        == [
            "torch.uint8",
            "FP8_PER_TENSOR",
        ]
    )
    assert plugin_pool["zeroing"] is False
    assert plugin_pool["index_bound_dtype"] == "torch.float8_e4m3fn"


def test_kernels_read_it_bit_for_bit_as_a_native_e4m3_cache(plugin_pool):
    assert "error" not in plugin_pool, plugin_pool.get("error")
    assert plugin_pool["identical"] == {
        "prefill_score": True,
        "prefill_topk": True,
        "prefill_out": True,
        "decode_topk": True,
        "decode_out": True,
    }
    assert plugin_pool["finite"] and plugin_pool["out_within_v"]
    # A real selection: 16 distinct blocks of the 32, the local block among them.
    for name in ("prefill_topk", "decode_topk"):
        for row in plugin_pool["topk"][name][0]:
            assert len(set(row)) == 16 and all(0 <= b < 32 for b in row), row
    assert 31 in plugin_pool["topk"]["decode_topk"][0][0]


def test_without_the_bind_time_view_the_kernels_cannot_read_it():
    mutant = json_from_out_file(
        [*CHILD, "--mutant", "no_bind_view"], kernel_env(), timeout=1800
    )
    assert mutant["index_bound_dtype"] == "torch.uint8"
    assert "error" in mutant or not all(mutant["identical"].values()), mutant


def test_the_stock_mixed_pool_runs_for_comparison(plugin_pool):
    """Stock vLLM's pool (bf16 index cache) holding the same values: it runs,
    and the plugin's fp8 index cache selects mostly the same blocks."""
    stock = json_from_out_file(CHILD, {**kernel_env(), **STOCK_VLLM}, timeout=1800)
    assert stock["index_spec"] == ["torch.bfloat16", "NONE"]
    assert stock["main_spec"] == ["torch.uint8", "FP8_PER_TENSOR"]
    assert stock["zeroing"] is True  # mixed: vLLM builds a zeroer
    assert stock["finite"] and stock["out_within_v"]
    for name in ("prefill_topk", "decode_topk"):
        bf16 = [set(row) for row in stock["topk"][name][0]]
        fp8 = [set(row) for row in plugin_pool["topk"][name][0]]
        recall = min(len(a & b) / len(a) for a, b in zip(bf16, fp8, strict=True))
        print(f"{name}: top-k recall of fp8 vs bf16 keys {recall:.2f}")
        assert recall > 0.5, (name, bf16, fp8)
