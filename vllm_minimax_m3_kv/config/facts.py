"""Facts for :func:`~vllm_minimax_m3_kv.config.indexer_precision.decide`.

Two sources, one shape: the live platform (what vLLM itself detects, used by
the config hook) and a named target (what ``check`` judges on a machine without
that GPU). Everything past the platform comes from the same vLLM config
objects in both cases, through :func:`precision_facts`.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vllm_minimax_m3_kv.config.kv_cache_dtype import CheckpointKVCache, auto_kv_cache
from vllm_minimax_m3_kv.config.pool_facts import (
    AITER_ENV,
    SHUFFLE_KV_ENV,
    PlatformFacts,
    PoolLayers,
    PrecisionFacts,
    SparseShape,
    kv_cache_dtype_for,
)
from vllm_minimax_m3_kv.config.targets import HERE, TARGET_PLATFORMS, judged_target
from vllm_minimax_m3_kv.envs import allow_mixed_from_env

if TYPE_CHECKING:
    from vllm.config import AttentionConfig, CacheConfig, ModelConfig, VllmConfig

MINIMAX_M3_ARCHITECTURES = (
    "MiniMaxM3SparseForConditionalGeneration",
    "MiniMaxM3SparseForCausalLM",
    "MiniMaxM3MTP",
)


def _rocm_env_flags() -> tuple[bool, bool]:
    # vllm.envs parses these exactly as the ROCm platform does at startup.
    import vllm.envs as envs

    return bool(envs.VLLM_ROCM_USE_AITER), bool(envs.VLLM_ROCM_SHUFFLE_KV_CACHE_LAYOUT)


def _unset_aiter_env() -> frozenset[str]:
    return frozenset(
        name for name in (AITER_ENV, SHUFFLE_KV_ENV) if name not in os.environ
    )


def target_platform_facts(target: str) -> PlatformFacts:
    """Facts for a named GPU, with AITER flags read from this environment.

    A ROCm target is assumed to run a ROCm vLLM image that ships aiter with
    its MSA kernels; the live hook checks that on the machine itself.
    """
    known = TARGET_PLATFORMS[target]
    aiter, shuffle = _rocm_env_flags() if known["vendor"] == "rocm" else (False, False)
    return PlatformFacts(
        **known,
        aiter_enabled=aiter,
        shuffle_kv_cache_layout=shuffle,
        unset_env=_unset_aiter_env() if known["vendor"] == "rocm" else frozenset(),
    )


# What the fp8 (MSA) indexer imports from aiter at model build.
AITER_MSA_MODULES = ("msa_block_select", "msa_attention")


@functools.cache
def aiter_has_msa_kernels() -> bool:
    """Whether the installed aiter ships the MSA modules, found without
    importing aiter (whose import loads GPU libraries).

    Once per process, as vLLM finds aiter once (``IS_AITER_FOUND``)."""
    spec = importlib.util.find_spec("aiter")
    for location in (spec.submodule_search_locations or []) if spec else []:
        ops = Path(location, "ops")
        if all(
            (ops / name).is_dir() or any(ops.glob(f"{name}.*"))
            for name in AITER_MSA_MODULES
        ):
            return True
    return False


def live_platform_facts() -> PlatformFacts:
    """Facts for the platform vLLM detected in this process."""
    if (target := judged_target()) is not None and target != HERE:
        return target_platform_facts(target)
    from vllm.platforms import current_platform

    if current_platform.is_rocm():
        from vllm import _aiter_ops
        from vllm.platforms import rocm

        # vLLM's AITER switches answer None, not False, without aiter; the
        # policy hears the variables as set and whether aiter is there.
        aiter, shuffle = _rocm_env_flags()
        installed = bool(_aiter_ops.is_aiter_found_and_supported())
        arch = getattr(rocm, "_GCN_ARCH", "") or "unknown arch"
        return PlatformFacts(
            name=f"ROCm {arch}",
            vendor="rocm",
            rocm_gfx950=bool(rocm.on_gfx950()),
            rocm_gfx942=bool(rocm.on_gfx942()),
            fp8_fnuz=bool(current_platform.is_fp8_fnuz()),
            aiter_enabled=aiter,
            shuffle_kv_cache_layout=shuffle,
            aiter_installed=installed,
            aiter_msa_kernels=installed and aiter_has_msa_kernels(),
            unset_env=_unset_aiter_env(),
        )
    if current_platform.is_cuda():
        capability = current_platform.get_device_capability()
        name = f"CUDA sm_{capability.to_int()}" if capability else "CUDA"
        return PlatformFacts(
            name=name,
            vendor="cuda",
            cuda_supports_fp8=current_platform.supports_fp8(),
            cuda_sm100_family=current_platform.is_device_capability_family(100),
        )
    return PlatformFacts(
        name=f"platform {current_platform.device_type!r}", vendor="other"
    )


def model_dtype_name(model_config: ModelConfig) -> str:
    """``--dtype`` as vLLM resolved it, e.g. ``"bfloat16"``."""
    return str(model_config.dtype).removeprefix("torch.")


def is_minimax_m3(model_config: ModelConfig | None) -> bool:
    return (
        model_config is not None
        and getattr(model_config, "architecture", None) in MINIMAX_M3_ARCHITECTURES
    )


@dataclass(frozen=True)
class ModelFacts:
    """What the policy reads from the model config alone."""

    num_layers: int
    sparse: frozenset[int]
    """The layers vLLM builds with sparse attention (and an index cache): as
    ``_sparse_attention_layer_ids`` in ``models/minimax_m3/{amd,nvidia}/
    model.py``, ``sparse_attention_freq`` alone (no model code reads
    ``use_sparse_attention``)."""
    shape: SparseShape
    num_kv_heads: int
    model_dtype: str
    auto_kv_cache: CheckpointKVCache | None
    """What ``--kv-cache-dtype auto`` stores: the checkpoint's declaration
    where vLLM applies it (None: the model dtype)."""


_model_facts: dict[int, tuple[weakref.ref[Any], ModelFacts]] = {}


def model_facts(model_config: ModelConfig) -> ModelFacts:
    """The model's facts, read once per ``ModelConfig`` object: the hook, the
    zeroing patch and ``check`` ask for them, and every read of the HF config
    goes through transformers' ``__getattribute__``."""
    key = id(model_config)
    if (cached := _model_facts.get(key)) is not None and cached[0]() is model_config:
        return cached[1]
    text = model_config.hf_text_config
    sparse_config = getattr(text, "sparse_attention_config", None) or {}
    num_layers = int(text.num_hidden_layers)
    freq = sparse_config.get("sparse_attention_freq") or ()
    sparse = frozenset(i for i, flag in enumerate(freq) if flag != 0)
    defaults = SparseShape()
    facts = ModelFacts(
        num_layers=num_layers,
        sparse=sparse,
        # The kernels' defaults where the checkpoint has no sparse config.
        shape=SparseShape(
            topk_blocks=int(
                sparse_config.get("sparse_topk_blocks", defaults.topk_blocks)
            ),
            sparse_block_size=int(
                sparse_config.get("sparse_block_size", defaults.sparse_block_size)
            ),
            index_head_dim=int(
                sparse_config.get("sparse_index_dim", defaults.index_head_dim)
            ),
            score_type=str(sparse_config.get("sparse_score_type", defaults.score_type)),
        ),
        num_kv_heads=int(text.num_key_value_heads),
        model_dtype=model_dtype_name(model_config),
        # MiniMax-M3's dense layers are vLLM's generic Attention.
        auto_kv_cache=auto_kv_cache(
            model_config, builds_generic_attention=len(sparse) < num_layers
        ),
    )
    _model_facts[key] = (
        weakref.ref(model_config, lambda _: _model_facts.pop(key, None)),
        facts,
    )
    return facts


def skip_layer_ids(cache_config: CacheConfig) -> frozenset[int]:
    """Layer indices ``--kv-cache-dtype-skip-layers`` names, as vLLM's
    ``Attention`` matches them (``str(layer_idx) in skip_layers``), including
    the boundary layers vLLM adds itself for TurboQuant caches.
    ``sliding_window`` matches no MiniMax-M3 layer (none has a window)."""
    return frozenset(
        int(name)
        for name in getattr(cache_config, "kv_cache_dtype_skip_layers", None) or ()
        if name.isdigit() and str(int(name)) == name
    )


def _pp_stage_starts(num_layers: int, pipeline_parallel_size: int) -> tuple[int, ...]:
    from vllm.distributed.utils import get_pp_indices

    return tuple(
        get_pp_indices(num_layers, rank, pipeline_parallel_size)[0]
        for rank in range(pipeline_parallel_size)
    )


# vLLM normalises "minimax_m3_mtp" to "mtp"; a MiniMax-M3 target's MTP drafter
# is always MiniMaxM3MTP.
MTP_METHODS = ("mtp", "minimax_m3_mtp")


def _speculative_field(speculative_config: Any, name: str) -> Any:
    # A SpeculativeConfig, or its CLI dict before vLLM builds one.
    if isinstance(speculative_config, dict):
        return speculative_config.get(name)
    return getattr(speculative_config, name, None)


def precision_facts(
    platform: PlatformFacts,
    *,
    model_config: ModelConfig,
    cache_config: CacheConfig,
    attention_config: AttentionConfig,
    tensor_parallel_size: int,
    pipeline_parallel_size: int = 1,
    speculative_config: Any = None,
) -> PrecisionFacts:
    """The policy's facts from vLLM's config objects (resolved or not), in one
    pass: each config field read once, where vLLM reads it."""
    model = model_facts(model_config)
    auto = model.auto_kv_cache
    flag = str(cache_config.cache_dtype)
    if auto is not None and not auto.applied_at_model_build and flag == auto.dtype:
        # modelopt's auto, resolved by create_engine_config before the hooks.
        flag = "auto"
    draft_kv = _speculative_field(speculative_config, "kv_cache_dtype")
    return PrecisionFacts(
        platform=platform,
        kv_cache_dtype=kv_cache_dtype_for(flag, None if auto is None else auto.dtype),
        kv_cache_flag=flag,
        kv_cache_source=None if auto is None else auto.field,
        auto_kv_cache_dtype=None if auto is None else auto.dtype,
        indexer_kv_dtype=str(attention_config.indexer_kv_dtype),
        max_model_len=int(model_config.max_model_len),
        shape=model.shape,
        tensor_parallel_size=int(tensor_parallel_size),
        kv_heads_per_rank=max(1, model.num_kv_heads // tensor_parallel_size),
        indexer_cp=bool(attention_config.minimax_m3_indexer_cp),
        model_dtype=model.model_dtype,
        allow_mixed=allow_mixed_from_env(),
        draft_kv_cache_dtype=None if draft_kv is None else str(draft_kv),
        layers=PoolLayers(
            num_layers=model.num_layers,
            sparse=model.sparse,
            skip_requested=skip_layer_ids(cache_config),
            # MiniMaxM3MTP builds its one layer with force_sparse_attn=True.
            drafter_index_cache=(
                speculative_config is not None
                and _speculative_field(speculative_config, "method") in MTP_METHODS
            ),
            pp_stage_starts=_pp_stage_starts(model.num_layers, pipeline_parallel_size),
        ),
    )


def live_facts(vllm_config: VllmConfig) -> PrecisionFacts:
    """The policy's facts for this engine config, on this process's platform."""
    parallel = vllm_config.parallel_config
    return precision_facts(
        live_platform_facts(),
        model_config=vllm_config.model_config,
        cache_config=vllm_config.cache_config,
        attention_config=vllm_config.attention_config,
        tensor_parallel_size=parallel.tensor_parallel_size,
        pipeline_parallel_size=parallel.pipeline_parallel_size,
        speculative_config=vllm_config.speculative_config,
    )
