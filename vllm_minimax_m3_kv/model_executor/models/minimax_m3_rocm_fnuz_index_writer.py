"""MiniMax-M3 on ROCm gfx942 (MI300X/MI325X): an fnuz index cache written right.

On gfx942 vLLM's fp8 KV cache is ``float8_e4m3fnuz``, so the index cache and
index query beside it are fnuz too (one precision in the pool; Triton's fp8
dots take fnuz natively there). vLLM's writer on the path without AITER is the
fused op ``fused_minimax_m3_qknorm_rope_kv_insert``, whose fp8 index store
picks its type with ``#if defined(HIP_FP8_TYPE_OCP)``: ROCm defines that macro
(as 0) on gfx942 too, so the OCP e4m3fn type would be used there, which is not
the cache's encoding. Nothing is written through that store here.

Instead, for an fnuz index cache, the model's one fused call becomes three
launches (two more per sparse layer):

1. the fused op as vLLM calls it for index-top-k reuse layers
   (``skip_index_branch=True``): main q/k norm and RoPE, main K/V insert,
   byte for byte what vLLM does today;
2. the fused op as vLLM's AITER branch calls it without a cache: norm and
   RoPE of every branch, the index query into a bf16 buffer and the index key
   left in place in ``qkv``. The main branches are done again: q into
   scratch, k in place over the main key that call 1 already inserted, which
   nothing reads afterwards (vLLM's attention reads K/V from the cache);
3. :func:`clamp_cast_index` (one Triton kernel of this plugin): index key and
   query clamped to vLLM's fnuz range (+-224, ``get_fp8_min_max``: torch's
   cast turns overflow into NaN) and cast, NaN kept NaN as torch's
   clamp-and-cast keeps it, the key scattered into the cache by
   the index slot mapping (padded slots, < 0, skipped), the query stored dense.

gfx950 and CUDA keep vLLM's fused op untouched (their e4m3fn type is OCP).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from types import ModuleType
from typing import Any

import torch

FNUZ = torch.float8_e4m3fnuz


def _fnuz() -> tuple[Any, int]:
    import triton.language as tl

    return tl.float8e4b8, 0x80  # fnuz has one NaN, the byte of -0


def _e4m3fn() -> tuple[Any, int]:
    import triton.language as tl

    return tl.float8e4nv, 0x7F


FP8_TYPES = {FNUZ: _fnuz, torch.float8_e4m3fn: _e4m3fn}
"""torch dtype -> (Triton's type, its NaN byte), for the types vLLM stores."""

EXTRA_LAUNCHES_PER_SPARSE_LAYER = 2
"""Launches added to vLLM's one fused call per sparse layer and step."""


def fnuz_max() -> float:
    """vLLM's fnuz range (224, not torch's 240: ``get_fp8_min_max``)."""
    from vllm.model_executor.layers.quantization.utils.quant_utils import (
        get_fp8_min_max,
    )

    return get_fp8_min_max()[1]


@functools.cache
def _kernel() -> Any:
    # Built on first use: plugin load imports no kernel code.
    import triton
    import triton.language as tl

    @triton.jit
    def clamp_cast_index_kernel(
        key_ptr,  # [tokens, HEAD_DIM] bf16 rows of qkv (strided)
        query_ptr,  # [tokens, QUERY_WIDTH] bf16
        cache_ptr,  # [blocks, BLOCK_SIZE, HEAD_DIM] fp8, as bytes
        query_out_ptr,  # [tokens, QUERY_WIDTH] fp8, as bytes
        slot_ptr,  # [tokens] int
        stride_key,
        stride_query,
        stride_cache_block,
        stride_cache_slot,
        stride_query_out,
        fp8_max,
        BLOCK_SIZE: tl.constexpr,
        HEAD_DIM: tl.constexpr,
        QUERY_WIDTH: tl.constexpr,
        BLOCK_Q: tl.constexpr,
        FP8: tl.constexpr,
        NAN_BITS: tl.constexpr,
    ):
        # Clamp, cast, and store the bytes; NaN is stored as the type's NaN,
        # as torch's clamp-and-cast stores it (tl.maximum and tl.minimum
        # would return the bound, and a cast of NaN is left to no backend).
        token = tl.program_id(0)
        dims = tl.arange(0, HEAD_DIM)
        key = tl.load(key_ptr + token * stride_key + dims).to(tl.float32)
        key_bits = tl.minimum(tl.maximum(key, -fp8_max), fp8_max).to(FP8)
        key_bits = key_bits.to(tl.uint8, bitcast=True)
        key_bits = tl.where(
            key != key, tl.full([HEAD_DIM], NAN_BITS, tl.uint8), key_bits
        )
        slot = tl.load(slot_ptr + token).to(tl.int64)
        block = slot // BLOCK_SIZE
        dst = cache_ptr + block * stride_cache_block
        dst += (slot - block * BLOCK_SIZE) * stride_cache_slot + dims
        tl.store(dst, key_bits, mask=(dims >= 0) & (slot >= 0))
        cols = tl.arange(0, BLOCK_Q)
        for start in range(0, QUERY_WIDTH, BLOCK_Q):
            offs = start + cols
            inside = offs < QUERY_WIDTH
            query = tl.load(
                query_ptr + token * stride_query + offs, mask=inside, other=0.0
            ).to(tl.float32)
            bits = tl.minimum(tl.maximum(query, -fp8_max), fp8_max).to(FP8)
            bits = bits.to(tl.uint8, bitcast=True)
            bits = tl.where(
                query != query, tl.full([BLOCK_Q], NAN_BITS, tl.uint8), bits
            )
            tl.store(query_out_ptr + token * stride_query_out + offs, bits, mask=inside)

    return clamp_cast_index_kernel


@torch.no_grad()
def clamp_cast_index(
    index_k: torch.Tensor,
    index_q: torch.Tensor,
    index_cache: torch.Tensor,
    index_q_out: torch.Tensor,
    index_slot_mapping: torch.Tensor,
    fp8_max: float,
) -> None:
    """Clamp to +-``fp8_max`` and cast ``index_k`` into ``index_cache`` at
    ``index_slot_mapping`` (slots < 0 skipped) and ``index_q`` into
    ``index_q_out``, in one launch."""
    tokens, head_dim = index_k.shape
    if tokens == 0:
        return
    if index_cache.dim() != 3 or index_cache.shape[2] != head_dim:
        raise ValueError(
            f"index cache {tuple(index_cache.shape)} does not hold {head_dim}-wide keys"
        )
    if index_cache.stride(2) != 1 or index_k.stride(1) != 1:
        raise ValueError("the index key and cache need a contiguous last dimension")
    if index_q.shape != index_q_out.shape or index_q_out.shape[0] != tokens:
        raise ValueError(
            f"index query {tuple(index_q.shape)} and its output "
            f"{tuple(index_q_out.shape)} disagree with {tokens} tokens"
        )
    if index_cache.dtype != index_q_out.dtype or index_cache.dtype not in FP8_TYPES:
        raise ValueError(
            f"the index cache ({index_cache.dtype}) and query ({index_q_out.dtype}) "
            "need one fp8 e4m3 type"
        )
    fp8, nan_bits = FP8_TYPES[index_cache.dtype]()
    query_width = index_q.shape[1]
    _kernel()[(tokens,)](
        index_k,
        index_q,
        index_cache.view(torch.uint8),
        index_q_out.view(torch.uint8),
        index_slot_mapping,
        index_k.stride(0),
        index_q.stride(0),
        index_cache.stride(0),
        index_cache.stride(1),
        index_q_out.stride(0),
        fp8_max,
        BLOCK_SIZE=index_cache.shape[1],
        HEAD_DIM=head_dim,
        QUERY_WIDTH=query_width,
        BLOCK_Q=min(512, 1 << (query_width - 1).bit_length()),
        FP8=fp8,
        NAN_BITS=nan_bits,
    )


def _fnuz_index_call(arguments: dict[str, Any]) -> bool:
    index_cache = arguments.get("index_cache")
    return index_cache is not None and index_cache.dtype == FNUZ


def wrap_fused_insert(original: Callable[..., None]) -> Callable[..., None]:
    """vLLM's fused insert, split as the module doc says where the index cache
    is fnuz, and called unchanged everywhere else."""
    signature = inspect.signature(original)

    def fused_minimax_m3_qknorm_rope_kv_insert(*args: Any, **kwargs: Any) -> None:
        bound = signature.bind(*args, **kwargs)
        if not _fnuz_index_call(bound.arguments):
            original(*args, **kwargs)
            return
        bound.apply_defaults()
        write_fnuz_index(original, bound.arguments)

    fused_minimax_m3_qknorm_rope_kv_insert.__wrapped__ = original  # type: ignore[attr-defined]
    fused_minimax_m3_qknorm_rope_kv_insert.__doc__ = original.__doc__
    return fused_minimax_m3_qknorm_rope_kv_insert


def write_fnuz_index(fused_insert: Callable[..., None], call: dict[str, Any]) -> None:
    """The three launches for one sparse layer with an fnuz index cache."""
    qkv = call["qkv"]
    index_cache, index_q_out = call["index_cache"], call["index_q_out"]
    if index_q_out is None or index_q_out.dtype != FNUZ:
        raise ValueError(
            "an fnuz index cache needs its index query in fnuz too (the Triton "
            f"dots take one fp8 type), got {getattr(index_q_out, 'dtype', None)}"
        )
    head_dim = call["q_norm_weight"].shape[-1]
    index_dim = index_cache.shape[-1]
    heads, kv_heads = call["num_heads"], call["num_kv_heads"]
    index_heads = call["num_index_heads"]
    index_k_start = (heads + 2 * kv_heads) * head_dim + index_heads * index_dim
    if qkv.shape[1] != index_k_start + index_dim:
        raise ValueError(
            f"qkv is {qkv.shape[1]} wide, not [q | k | v | index_q | index_k] = "
            f"{index_k_start + index_dim}"
        )
    norm_rope = {
        name: call[name]
        for name in (
            "qkv",
            "q_norm_weight",
            "k_norm_weight",
            "cos_sin_cache",
            "positions",
            "num_heads",
            "num_kv_heads",
            "rotary_dim",
            "eps",
        )
    }
    # 1. Main branches and the main K/V insert: vLLM's reuse-layer call.
    fused_insert(
        **norm_rope,
        num_index_heads=index_heads,
        slot_mapping=call["slot_mapping"],
        kv_cache=call["kv_cache"],
        block_size=call["block_size"],
        q_out=call["q_out"],
        kv_cache_dtype=call["kv_cache_dtype"],
        skip_index_branch=True,
    )
    # 2. Norm and RoPE of the index branch, no cache: vLLM's AITER-branch call.
    index_q = torch.empty(index_q_out.shape, dtype=qkv.dtype, device=qkv.device)
    fused_insert(
        **norm_rope,
        index_q_norm_weight=call["index_q_norm_weight"],
        index_k_norm_weight=call["index_k_norm_weight"],
        num_index_heads=index_heads,
        q_out=torch.empty(
            (qkv.shape[0], heads * head_dim), dtype=qkv.dtype, device=qkv.device
        ),
        index_q_out=index_q,
        kv_cache_dtype=call["kv_cache_dtype"],
    )
    # 3. Clamp, cast and store the index key and query.
    slots = call["index_slot_mapping"]
    clamp_cast_index(
        qkv[:, index_k_start : index_k_start + index_dim],
        index_q,
        index_cache,
        index_q_out,
        call["slot_mapping"] if slots is None else slots,
        fnuz_max(),
    )


class OpsWithFnuzIndexWriter(ModuleType):
    """``vllm._custom_ops`` as the ROCm MiniMax-M3 model sees it: every op as
    is, the fused insert wrapped by :func:`wrap_fused_insert`."""

    def __init__(self, ops: ModuleType) -> None:
        super().__init__(ops.__name__, ops.__doc__)
        self.__wrapped__ = ops
        self.fused_minimax_m3_qknorm_rope_kv_insert = wrap_fused_insert(
            ops.fused_minimax_m3_qknorm_rope_kv_insert
        )

    def __getattr__(self, name: str) -> Any:
        return getattr(self.__wrapped__, name)
