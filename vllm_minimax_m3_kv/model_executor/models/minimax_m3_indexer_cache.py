"""MiniMax-M3 indexer cache: fp8 stored and described the way the main cache is.

vLLM 0.33 describes an fp8 main cache as ``(torch.uint8, FP8_PER_TENSOR)`` and
the fp8 indexer cache as ``(torch.float8_e4m3fn, NONE)``: the same e4m3 bytes,
two descriptions, so ``KVCacheConfig.has_mixed_precision_kv_cache`` reports a
mixed pool and a zeroer is built. Here the indexer cache adopts the main
cache's description in its spec and views its bound tensor back as its own
fp8 type, so the kernels see exactly what they saw before and the page size
does not change (both dtypes are one byte).

The index cache's fp8 type is the platform's, as the main cache's is
(``current_platform.fp8_dtype()``, which MiniMax-M3's sparse attention views
its main cache as): e4m3fn on CUDA and gfx950, e4m3fnuz on gfx942, where vLLM
0.33 would otherwise store OCP e4m3fn beside an fnuz main cache.

Both the type and the description come from the config-time decision as the
hook recorded it (``config/recorded_verdict.py``), not from
``cache_config`` or the platform asked again; with no record, vLLM's own.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import torch

from vllm_minimax_m3_kv.config.recorded_verdict import recorded_verdict

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.v1.kv_cache_interface import KVCacheSpec

INDEXER_FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e4m3fnuz)


def describe_like_main_cache(spec: KVCacheSpec, vllm_config: VllmConfig) -> KVCacheSpec:
    """The indexer spec with the main fp8 cache's storage dtype and quant mode."""
    from vllm.utils.torch_utils import kv_cache_dtype_str_to_dtype
    from vllm.v1.kv_cache_interface import get_kv_quant_mode

    decided = recorded_verdict(vllm_config)
    if decided is None or not decided.fp8_main_cache:
        return spec  # no decision on this config, or no fp8 main cache to match
    if spec.dtype not in INDEXER_FP8_DTYPES:
        return spec
    main_dtype = decided.kv_cache_dtype
    storage = kv_cache_dtype_str_to_dtype(main_dtype, vllm_config.model_config)
    if storage.itemsize != spec.dtype.itemsize:
        return spec  # a different page size would change the plan; leave it
    return replace(spec, dtype=storage, kv_quant_mode=get_kv_quant_mode(main_dtype))


def wrap_init(original: Callable[..., None]) -> Callable[..., None]:
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        from vllm.config import get_current_vllm_config_or_none

        original(self, *args, **kwargs)
        # vLLM picks e4m3fn for "fp8" on every platform; the model allocates
        # the index query in this dtype too, so both follow the platform's,
        # as the decision recorded it (vLLM builds layers under the config).
        decided = recorded_verdict(get_current_vllm_config_or_none())
        if decided is not None and self.dtype in INDEXER_FP8_DTYPES:
            self.dtype = getattr(torch, decided.fp8_dtype_name)

    __init__.__wrapped__ = original  # type: ignore[attr-defined]
    return __init__


def wrap_get_kv_cache_spec(original: Callable[..., Any]) -> Callable[..., Any]:
    def get_kv_cache_spec(self: Any, vllm_config: VllmConfig) -> KVCacheSpec:
        return describe_like_main_cache(original(self, vllm_config), vllm_config)

    get_kv_cache_spec.__wrapped__ = original  # type: ignore[attr-defined]
    return get_kv_cache_spec


def wrap_bind_kv_cache(original: Callable[..., Any]) -> Callable[..., Any]:
    def bind_kv_cache(self: Any, kv_cache: torch.Tensor) -> None:
        # The allocator hands out the spec's storage dtype; the indexer kernels
        # index the cache as fp8 e4m3, so give them the same bytes in it.
        if (
            self.dtype in INDEXER_FP8_DTYPES
            and kv_cache.dtype != self.dtype
            and kv_cache.element_size() == self.dtype.itemsize
        ):
            kv_cache = kv_cache.view(self.dtype)
        original(self, kv_cache)

    bind_kv_cache.__wrapped__ = original  # type: ignore[attr-defined]
    return bind_kv_cache
