"""Child for ``test_stale_bytes.py``: do unwritten KV slots reach a result?

``python -m tests.kernels.stale_bytes --out F [--lengths 2049,2112]
[--with-witness]`` builds the pool the loaded plugins give (fp8 KV cache,
TP 8, the tiny MiniMax-M3), allocated and bound as vLLM's worker does. For each
request length and each stale pattern it fills every byte of the bound pool
with the pattern, writes one request of that length token by token (index keys
and fp8 K/V, as the fused insert stores them), and runs vLLM's prefill and
decode indexer and sparse attention on it. It reports, per length and output,
whether the results are bit-identical across patterns.

``--with-witness`` adds the witness, in the same process: at the first length
the request's ``seq_len`` claims one slot more than was written, so that slot
is stale and must show (zeros against 0xFF is enough to see it).
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

from vllm_minimax_m3_kv_sim.kernels import (
    BoundPool,
    Request,
    bound_pool,
    prepare_triton,
)
from vllm_minimax_m3_kv_sim.kernels import run_indexer_and_attention as run_kernels

BLOCK = 128
QUERIES = 2
# One slot past a block boundary, and half a block past it: 17 blocks, more
# than the top-16 the indexer keeps, so it really selects.
LENGTHS = (16 * BLOCK + 1, 16 * BLOCK + BLOCK // 2)
PATTERNS = ("zeros", "0xFF", "largest_finite", "random")


def _fill(cache: Any, read_as: Any, pattern: str, seed: int) -> None:
    """Every byte of ``cache``, for the dtype its kernels read it as."""
    import torch

    raw = cache.view(torch.uint8)
    if pattern == "zeros":
        raw.fill_(0)
    elif pattern == "0xFF":
        raw.fill_(0xFF)  # NaN in e4m3fn and in bf16
    elif pattern == "largest_finite":
        cache.view(read_as).fill_(torch.finfo(read_as).max)
    else:
        generator = torch.Generator(device=raw.device).manual_seed(seed)
        raw.copy_(
            torch.randint(
                0, 256, raw.shape, dtype=torch.uint8, generator=generator,
                device=raw.device,
            )
        )  # fmt: skip


def _request_values(pool: BoundPool, length: int, seed: int = 0) -> dict[str, Any]:
    import torch

    generator = torch.Generator().manual_seed(seed)
    blocks = math.ceil((length + 1) / BLOCK)
    index_dim = pool.index_cache.shape[-1]
    main = pool.main_layer
    keys = torch.randn(length, index_dim, generator=generator)
    keys = keys / keys.pow(2).mean(-1, keepdim=True).sqrt()  # RMS-normed
    heads, head_bytes = main.kv_cache.shape[1], main.kv_cache.shape[-1]
    kv = torch.randn(length, heads, head_bytes, generator=generator)
    impl = main.impl
    index_q = torch.randn(QUERIES + 1, heads, index_dim, generator=generator)
    q = torch.randn(QUERIES + 1, impl.num_heads, impl.head_size, generator=generator)
    table = torch.randperm(pool.kv_cache_config.num_blocks - 1, generator=generator)
    return {
        "table": (table[:blocks] + 1).to(torch.int32).view(1, -1),
        "keys": keys,
        "kv": kv,
        "index_q": index_q.to(torch.bfloat16),
        "q": q.to(torch.bfloat16),
    }


def _write_tokens(pool: BoundPool, values: dict[str, Any], length: int) -> None:
    """Tokens 0..length-1 only, each in its block and slot, as the insert does."""
    import torch

    device = pool.device
    table = values["table"].view(-1).long()
    tokens = torch.arange(length)
    blocks, slots = table[tokens // BLOCK].to(device), (tokens % BLOCK).to(device)
    index_dtype = pool.layers[pool.sparse_layer].dtype
    keys = values["keys"].to(index_dtype).to(device)
    pool.index_cache.view(index_dtype)[blocks, slots] = keys
    fp8 = pool.main_layer.impl.kv_cache_fp8_dtype
    main = pool.main_layer.kv_cache.view(fp8)
    main[blocks, :, slots] = values["kv"].to(fp8).to(device)


def _bits(tensor: Any) -> list:
    import torch

    width = {2: torch.int16, 4: torch.int32, 8: torch.int64}.get(tensor.element_size())
    if tensor.is_floating_point() and width is not None:
        tensor = tensor.view(width)
    return tensor.cpu().flatten().tolist()


def run_length(
    pool: BoundPool,
    length: int,
    claim_extra_slot: bool = False,
    patterns: tuple[str, ...] = PATTERNS,
) -> dict:
    """Per output: bit-identical across every stale pattern?"""
    import torch

    values = _request_values(pool, length)
    seq_len = length + 1 if claim_extra_slot else length
    own_blocks = math.ceil(seq_len / BLOCK)
    fp8 = pool.main_layer.impl.kv_cache_fp8_dtype
    index_dtype = pool.layers[pool.sparse_layer].dtype
    results: dict[str, list] = {}
    for seed, pattern in enumerate(patterns):
        for name, layer in pool.layers.items():
            read_as = index_dtype if name.endswith("index_cache") else fp8
            _fill(layer.kv_cache, read_as, pattern, seed)
        _write_tokens(pool, values, length)
        # A request of seq_len tokens whose last QUERIES are the prefill's.
        outputs = run_kernels(
            pool,
            pool.index_cache,
            pool.main_cache,
            Request(values["table"], seq_len, QUERIES),
            values["index_q"].to(pool.device),
            values["q"].to(pool.device),
        )
        # Past the request's last block the score buffer is never written.
        outputs["prefill_score"] = outputs["prefill_score"][..., :own_blocks]
        for name, tensor in outputs.items():
            results.setdefault(name, []).append(_bits(tensor))
        results.setdefault("finite_out", []).append(
            all(
                bool(torch.isfinite(outputs[n]).all())
                for n in ("prefill_out", "decode_out")
            )
        )
    finite = results.pop("finite_out")
    return {
        "identical": {
            name: all(run == runs[0] for run in runs) for name, runs in results.items()
        },
        "finite_out": dict(zip(patterns, finite, strict=True)),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--lengths", default=",".join(map(str, LENGTHS)))
    parser.add_argument("--with-witness", action="store_true")
    options = parser.parse_args()
    device = prepare_triton()
    pool = bound_pool(
        {"kv_cache_dtype": "fp8", "max_model_len": 8192, "tensor_parallel_size": 8},
        device,
    )
    index = pool.spec_of(pool.sparse_layer)
    main_spec = pool.spec_of(pool.sparse_layer.removesuffix(".index_cache"))
    result = {
        "device": device,
        "index_spec": index,
        "main_spec": main_spec,
        "zeroing": pool.kv_cache_config.needs_kv_cache_zeroing,
        "lengths": {
            length: run_length(pool, int(length))
            for length in options.lengths.split(",")
        },
    }
    if options.with_witness:
        result["witness"] = run_length(
            pool, LENGTHS[0], claim_extra_slot=True, patterns=PATTERNS[:2]
        )
    Path(options.out).write_text(json.dumps(result))


if __name__ == "__main__":
    main()
