"""Child for ``test_minimax_m3_kernels.py``: one KV pool, vLLM's kernels on it.

``python -m tests.kernels.pool_kernels --out F [--mutant no_bind_view]``
builds the pool the loaded plugins give (fp8 KV cache, TP 8, the tiny
MiniMax-M3), allocates and binds it as vLLM's worker does, writes index keys
(the index cache's dtype, cast as the fused insert casts RMS-normed keys) and
fp8 K/V byte for byte into the bound caches, runs vLLM's prefill and decode
indexer kernels and sparse attention on them, and again (fp8 index cache) on
natively allocated tensors holding the same bytes in the dtype the kernels
index. The values depend on the seed only, so runs on different pools compare.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from vllm_minimax_m3_kv_sim.kernels import (
    BoundPool,
    Request,
    bound_pool,
    prepare_triton,
    run_indexer_and_attention,
    write_bytes,
)

CONTEXT = 4096  # 32 blocks of 128: the top-k (16 blocks) really selects
QUERIES = 2


def _data(pool: BoundPool, seed: int = 0) -> dict[str, Any]:
    """Keys, K/V and queries from ``seed`` alone, so pools of different block
    counts (the plugin's, stock vLLM's) hold the same values."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    blocks = CONTEXT // 128
    index_dim = pool.index_cache.shape[-1]
    keys = torch.randn(CONTEXT, index_dim, generator=generator)
    keys = keys / keys.pow(2).mean(-1, keepdim=True).sqrt()  # RMS-normed
    main_shape = pool.main_layer.kv_cache.shape
    kv = torch.randn(blocks, *main_shape[1:], generator=generator)
    impl = pool.main_layer.impl
    index_heads = pool.main_layer.kv_cache.shape[1]
    index_q = torch.randn(QUERIES + 1, index_heads, index_dim, generator=generator)
    q = torch.randn(QUERIES + 1, impl.num_heads, impl.head_size, generator=generator)
    # Physical blocks in a shuffled order, as a block table maps them.
    table = torch.randperm(pool.kv_cache_config.num_blocks - 1, generator=generator)
    table = (table[:blocks] + 1).to(torch.int32).view(1, -1)
    return {
        "table": table,
        "keys": keys.view(blocks, 128, index_dim),
        "kv": kv,
        "index_q": index_q,
        "q": q,
    }


def _run(pool: BoundPool, index_cache: Any, main_cache: Any, data: dict) -> dict:
    import torch

    request = Request(data["table"], CONTEXT, QUERIES)
    device = pool.device
    return run_indexer_and_attention(
        pool,
        index_cache,
        main_cache,
        request,
        data["index_q"].to(torch.bfloat16).to(device),
        data["q"].to(torch.bfloat16).to(device),
    )


def _bits(tensor: Any) -> list:
    import torch

    if tensor.dtype == torch.bfloat16:
        tensor = tensor.view(torch.int16)
    elif tensor.dtype == torch.float32:
        tensor = tensor.view(torch.int32)
    return tensor.cpu().flatten().tolist()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--mutant", choices=["no_bind_view"])
    options = parser.parse_args()
    device = prepare_triton()
    if options.mutant == "no_bind_view":
        # The plugin's bind_kv_cache without its e4m3 view: what a test of
        # this cache must catch.
        from vllm.models.minimax_m3.common.indexer import MiniMaxM3IndexerCache

        import vllm_minimax_m3_kv

        vllm_minimax_m3_kv.register()  # wraps the method on import; unwrap it
        MiniMaxM3IndexerCache.bind_kv_cache = (
            MiniMaxM3IndexerCache.bind_kv_cache.__wrapped__
        )
    import torch

    pool = bound_pool(
        {"kv_cache_dtype": "fp8", "max_model_len": 8192, "tensor_parallel_size": 8},
        device,
    )
    index_layer = pool.layers[pool.sparse_layer]
    data = _data(pool)
    blocks = data["table"].view(-1).long().to(device)
    # As the fused insert writes them: the index cache's dtype, then bytes.
    write_bytes(pool.index_cache, blocks, data["keys"].to(index_layer.dtype).to(device))
    fp8 = pool.main_layer.impl.kv_cache_fp8_dtype
    write_bytes(pool.main_layer.kv_cache, blocks, data["kv"].to(fp8).to(device))
    result: dict[str, Any] = {
        "device": device,
        "index_spec": pool.spec_of(pool.sparse_layer),
        "main_spec": pool.spec_of(pool.sparse_layer.removesuffix(".index_cache")),
        "index_bound_dtype": str(pool.index_cache.dtype),
        "index_layer_dtype": str(index_layer.dtype),
        "zeroing": pool.kv_cache_config.needs_kv_cache_zeroing,
    }
    # The same bytes, allocated natively in the dtype the kernels index.
    native_index = torch.zeros(
        pool.index_cache.shape, dtype=index_layer.dtype, device=device
    )
    write_bytes(native_index, blocks, data["keys"].to(index_layer.dtype).to(device))
    native_main = torch.zeros(pool.main_cache.shape, dtype=fp8, device=device)
    write_bytes(native_main, blocks, data["kv"].to(fp8).to(device))
    try:
        ours = _run(pool, pool.index_cache, pool.main_cache, data)
    except Exception as error:  # the mutant may not even run
        result["error"] = f"{type(error).__name__}: {error}"[:500]
        Path(options.out).write_text(json.dumps(result))
        return
    if index_layer.dtype == torch.float8_e4m3fn:
        native = _run(pool, native_index, native_main, data)
        result["identical"] = {
            name: _bits(ours[name]) == _bits(native[name]) for name in ours
        }
    result["topk"] = {
        name: ours[name].cpu().tolist() for name in ("prefill_topk", "decode_topk")
    }
    result["finite"] = all(
        bool(torch.isfinite(ours[name]).all()) for name in ("prefill_out", "decode_out")
    )
    # Attention output is a convex combination of V rows: no larger than the
    # largest stored V (what a misread operand breaks first).
    head_size = pool.main_layer.impl.head_size
    largest_v = data["kv"].to(fp8)[..., head_size:].float().abs().max()
    result["out_within_v"] = all(
        float(ours[name].float().abs().max()) <= float(largest_v) * 1.01
        for name in ("prefill_out", "decode_out")
    )
    Path(options.out).write_text(json.dumps(result))


if __name__ == "__main__":
    main()
