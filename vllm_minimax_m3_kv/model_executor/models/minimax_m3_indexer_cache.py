"""MiniMax-M3 indexer cache: describe fp8 storage the way the main cache does.

vLLM 0.33 describes an fp8 main cache as ``(torch.uint8, FP8_PER_TENSOR)`` and
the fp8 indexer cache as ``(torch.float8_e4m3fn, NONE)``: the same e4m3 bytes,
two descriptions, so ``KVCacheConfig.has_mixed_precision_kv_cache`` reports a
mixed pool and a zeroer is built. Here the indexer cache adopts the main
cache's description in its spec and views its bound tensor back as
``float8_e4m3fn``, so the kernels see exactly what they saw before and the page
size does not change (both dtypes are one byte).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import torch

from vllm_minimax_m3_kv.config.indexer_precision import FP8_E4M3_KV_CACHE_DTYPES

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.v1.kv_cache_interface import KVCacheSpec

INDEXER_FP8_DTYPE = torch.float8_e4m3fn


def describe_like_main_cache(spec: KVCacheSpec, vllm_config: VllmConfig) -> KVCacheSpec:
    """The indexer spec with the main fp8 cache's storage dtype and quant mode."""
    from vllm.utils.torch_utils import kv_cache_dtype_str_to_dtype
    from vllm.v1.kv_cache_interface import get_kv_quant_mode

    main_dtype_str = vllm_config.cache_config.cache_dtype
    if (
        spec.dtype != INDEXER_FP8_DTYPE
        or main_dtype_str not in FP8_E4M3_KV_CACHE_DTYPES
    ):
        return spec
    storage = kv_cache_dtype_str_to_dtype(main_dtype_str, vllm_config.model_config)
    if storage.itemsize != INDEXER_FP8_DTYPE.itemsize:
        return spec  # a different page size would change the plan; leave it
    return replace(spec, dtype=storage, kv_quant_mode=get_kv_quant_mode(main_dtype_str))


def wrap_get_kv_cache_spec(original: Callable[..., Any]) -> Callable[..., Any]:
    def get_kv_cache_spec(self: Any, vllm_config: VllmConfig) -> KVCacheSpec:
        return describe_like_main_cache(original(self, vllm_config), vllm_config)

    get_kv_cache_spec.__wrapped__ = original  # type: ignore[attr-defined]
    return get_kv_cache_spec


def wrap_bind_kv_cache(original: Callable[..., Any]) -> Callable[..., Any]:
    def bind_kv_cache(self: Any, kv_cache: torch.Tensor) -> None:
        # The allocator hands out the spec's storage dtype; the indexer kernels
        # index the cache as e4m3, so give them the same bytes as e4m3.
        if (
            self.dtype == INDEXER_FP8_DTYPE
            and kv_cache.dtype != INDEXER_FP8_DTYPE
            and kv_cache.element_size() == INDEXER_FP8_DTYPE.itemsize
        ):
            kv_cache = kv_cache.view(INDEXER_FP8_DTYPE)
        original(self, kv_cache)

    bind_kv_cache.__wrapped__ = original  # type: ignore[attr-defined]
    return bind_kv_cache
