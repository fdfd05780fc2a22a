"""MiniMax-M3 on ROCm gfx950 and gfx942: vLLM's Triton indexer with an fp8 index cache.

vLLM 0.33 gives ROCm an fp8 index cache only through the AITER MSA indexer.
Without AITER sparse paged attention the model builds the neutral
``MiniMaxM3Indexer``, whose ``select_indexer_impl_cls`` refuses fp8 because
the platform is not CUDA, although the Triton kernels it would pick on ROCm
(``models/minimax_m3/amd/ops/index_topk.py``) load K and Q in their stored
dtype with fp32 accumulation, and the model already allocates the index query
in the index cache's dtype and writes both with the fused insert.

Here the gate selects ``MiniMaxM3IndexerTritonImpl`` for an fp8 e4m3 index
cache on gfx950, and on gfx942 where the cache is e4m3fnuz and the plugin's
writer fills it (``minimax_m3_rocm_fnuz_index_writer``); AITER sparse paged
attention off on both, since beside it AITER's kernels or vLLM's unclamped
Triton insert write the index cache; not for the
context-parallel indexer, which stays bf16; after
the node self-test (``vllm_minimax_m3_kv.selftest``) has checked the kernels on
this GPU; and the ROCm MTP drafter's bf16-only check lets its draft layers take
the same indexer.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from contextvars import ContextVar
from types import CodeType
from typing import Any

from vllm_minimax_m3_kv.config.pool_facts import FP8_E4M3_DTYPES
from vllm_minimax_m3_kv.config.vllm_gates import ROCM_TRITON_INDEXER


def rocm_fp8_triton_indexer_applies(indexer_kv_dtype: str) -> bool:
    """Whether this process's model build takes the plugin's fp8 Triton path:
    ROCm gfx950 or gfx942, an fp8 e4m3 index cache, indexer CP off."""
    if indexer_kv_dtype not in FP8_E4M3_DTYPES:
        return False
    from vllm.platforms import current_platform

    if not current_platform.is_rocm():
        return False
    from vllm.platforms import rocm

    if not (rocm.on_gfx950() or rocm.on_gfx942()):
        return False
    if _aiter_sparse_pa_requested():
        # AITER's kernels or vLLM's unclamped Triton insert would write the
        # index cache, not the writer the self-test vouches for
        # (vllm_gates: rocm_triton_fp8_beside_aiter_sparse_pa).
        return False
    from vllm.config import get_current_vllm_config

    return not get_current_vllm_config().attention_config.minimax_m3_indexer_cp


def _aiter_sparse_pa_requested() -> bool:
    from vllm.models.minimax_m3.common.sparse_attention import (
        _minimax_m3_aiter_sparse_pa_requested,
    )

    return bool(_minimax_m3_aiter_sparse_pa_requested())


def wrap_select_indexer_impl_cls(
    original: Callable[..., type],
    triton_impl: type,
    before_selecting: Callable[[], None],
) -> Callable[..., type]:
    """``select_indexer_impl_cls`` that returns ``triton_impl`` for an fp8
    index cache on gfx950 or gfx942, once ``before_selecting`` (the node self-test) has
    passed, and asks vLLM's own selection everywhere else."""

    def select_indexer_impl_cls(
        *, topk_blocks: int, indexer_kv_dtype: str = "bf16"
    ) -> type:
        if not rocm_fp8_triton_indexer_applies(indexer_kv_dtype):
            return original(topk_blocks=topk_blocks, indexer_kv_dtype=indexer_kv_dtype)
        before_selecting()
        from vllm.platforms import current_platform, rocm

        from vllm_minimax_m3_kv._log import get_logger

        get_logger(__name__).info_once(
            "MiniMax M3 indexer: selected Triton with an fp8 index cache on "
            "%s (%s, by vllm-minimax-m3-kv) [topk_blocks=%d, "
            "indexer_kv_dtype=%s, %s]",
            "gfx950" if rocm.on_gfx950() else "gfx942",
            ROCM_TRITON_INDEXER,
            topk_blocks,
            indexer_kv_dtype,
            str(current_platform.fp8_dtype()).removeprefix("torch."),
        )
        return triton_impl

    select_indexer_impl_cls.__wrapped__ = original  # type: ignore[attr-defined]
    select_indexer_impl_cls.__doc__ = original.__doc__
    return select_indexer_impl_cls


_MTP_GUARD: ContextVar[CodeType | None] = ContextVar(
    "minimax_m3_mtp_guard", default=None
)
"""The code of the drafter ``__init__`` running on the fp8 Triton path in this
context (thread or task), whose own bf16-only check hears "bf16"."""


def wrap_resolve_indexer_kv_dtype(original: Callable[..., str]) -> Callable[..., str]:
    """``AttentionConfig.resolve_indexer_kv_dtype``, installed once: answers
    "bf16" to a call made directly from the drafter ``__init__`` that
    :func:`wrap_mtp_init` marks in this context, and vLLM's own answer to
    every other call (other threads, the layers it builds, everyone else)."""

    def resolve_indexer_kv_dtype(config: Any, default: str) -> str:
        resolved = original(config, default)
        guarded = _MTP_GUARD.get()
        if guarded is not None and sys._getframe(1).f_code is guarded:
            return "bf16"  # the drafter's guard; its layers ask elsewhere
        return resolved

    resolve_indexer_kv_dtype.__wrapped__ = original  # type: ignore[attr-defined]
    resolve_indexer_kv_dtype.__doc__ = original.__doc__
    return resolve_indexer_kv_dtype


def wrap_mtp_init(original: Callable[..., None]) -> Callable[..., None]:
    """``MiniMaxM3MultiTokenPredictor.__init__`` whose own bf16-only check
    (made where the MSA indexer is not selected) hears "bf16" when the fp8
    Triton path applies; every layer it builds still reads the fp8 dtype.

    The check is inline in vLLM's ``__init__``: only a call made directly from
    that function's frame, in this context, is answered differently
    (:func:`wrap_resolve_indexer_kv_dtype`); nothing on the class is swapped
    while it runs, so concurrent builds cannot interleave."""

    def __init__(self: Any, *, vllm_config: Any, prefix: str = "") -> None:
        requested = vllm_config.attention_config.resolve_indexer_kv_dtype("bf16")
        if not rocm_fp8_triton_indexer_applies(requested):
            original(self, vllm_config=vllm_config, prefix=prefix)
            return
        token = _MTP_GUARD.set(original.__code__)
        try:
            original(self, vllm_config=vllm_config, prefix=prefix)
        finally:
            _MTP_GUARD.reset(token)

    __init__.__wrapped__ = original  # type: ignore[attr-defined]
    return __init__


def wrap_decode_score_program_budget(
    original: Callable[..., int | None], enabled: bool
) -> Callable[..., int | None]:
    """vLLM's ROCm decode launch policy, which gives its tuned "balanced"
    score kernel to a bf16 query and cache only; ``enabled``, an fp8 e4m3
    query and cache are offered it as well (the same kernel loads K and Q in
    their stored dtype and accumulates in fp32)."""
    import torch

    fp8 = (torch.float8_e4m3fn, torch.float8_e4m3fnuz)

    def _decode_score_program_budget(
        num_reqs: int, head_dim: int, query_dtype: Any, cache_dtype: Any, **kwargs: Any
    ) -> int | None:
        if enabled and query_dtype == cache_dtype and query_dtype in fp8:
            query_dtype = cache_dtype = torch.bfloat16
        return original(num_reqs, head_dim, query_dtype, cache_dtype, **kwargs)

    _decode_score_program_budget.__wrapped__ = original  # type: ignore[attr-defined]
    return _decode_score_program_budget
