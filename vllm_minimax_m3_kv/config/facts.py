"""Facts for :func:`~vllm_minimax_m3_kv.config.indexer_precision.decide`.

Two sources, one shape: the live platform (what vLLM itself detects, used by
the config hook) and a named target (what ``check`` judges on a machine without
that GPU). Everything past the platform comes from the same vLLM config
objects in both cases, through :func:`precision_facts`.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import os
from collections.abc import Iterator, Mapping
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vllm_minimax_m3_kv.config.kv_cache_dtype import (
    CheckpointKVCache,
    MainKVCacheDtype,
    compressed_tensors_kv_cache,
    effective_main_kv_cache_dtype,
    modelopt_kv_cache,
)
from vllm_minimax_m3_kv.config.pool_facts import (
    AITER_ENV,
    SHUFFLE_KV_ENV,
    PlatformFacts,
    PoolLayers,
    PrecisionFacts,
    SparseShape,
)
from vllm_minimax_m3_kv.config.verdicts import Verdict
from vllm_minimax_m3_kv.envs import allow_mixed_from_env

if TYPE_CHECKING:
    from vllm.config import AttentionConfig, CacheConfig, ModelConfig, VllmConfig

MINIMAX_M3_ARCHITECTURES = (
    "MiniMaxM3SparseForConditionalGeneration",
    "MiniMaxM3SparseForCausalLM",
    "MiniMaxM3MTP",
)

# Hardware the offline check can judge. AITER flags come from the environment.
_TARGETS: dict[str, dict[str, Any]] = {
    "mi355x": {"name": "ROCm gfx950 (MI355X)", "vendor": "rocm", "rocm_gfx950": True},
    "mi350x": {"name": "ROCm gfx950 (MI350X)", "vendor": "rocm", "rocm_gfx950": True},
    "mi325x": {"name": "ROCm gfx942 (MI325X)", "vendor": "rocm", "rocm_gfx942": True},
    "mi300x": {"name": "ROCm gfx942 (MI300X)", "vendor": "rocm", "rocm_gfx942": True},
    "mi250x": {"name": "ROCm gfx90a (MI250X)", "vendor": "rocm"},
    "b300": {
        "name": "CUDA sm_103 (B300)",
        "vendor": "cuda",
        "cuda_supports_fp8": True,
        "cuda_sm100_family": True,
    },
    "b200": {
        "name": "CUDA sm_100 (B200)",
        "vendor": "cuda",
        "cuda_supports_fp8": True,
        "cuda_sm100_family": True,
    },
    "h200": {"name": "CUDA sm_90 (H200)", "vendor": "cuda", "cuda_supports_fp8": True},
    "h100": {"name": "CUDA sm_90 (H100)", "vendor": "cuda", "cuda_supports_fp8": True},
    "a100": {"name": "CUDA sm_80 (A100)", "vendor": "cuda"},
}
TARGETS = tuple(_TARGETS)
HERE = "here"
"""``check --target here``: this machine's own platform, aiter and vLLM."""


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
    known = _TARGETS[target]
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


@dataclass
class Judgement:
    """The first verdict the live hook reached while judging for a target."""

    facts: PrecisionFacts | None = None
    verdict: Verdict | None = None


_judging_for: ContextVar[tuple[str, Judgement] | None] = ContextVar(
    "judging_for", default=None
)
"""The target ``check`` judges for (``HERE``: the live platform), and where
the hook records its verdict."""


@contextlib.contextmanager
def judging_for(target: str) -> Iterator[Judgement]:
    """Let the live hook judge for a named target (``check`` runs vLLM's own
    config validation on its CPU platform, and the verdict is for the GPU).
    Yields where the hook records what it decided."""
    judgement = Judgement()
    token = _judging_for.set((target, judgement))
    try:
        yield judgement
    finally:
        _judging_for.reset(token)


def record_judgement(facts: PrecisionFacts, verdict: Verdict) -> None:
    """Called by the live hook; kept only inside :func:`judging_for`."""
    current = _judging_for.get()
    if current is not None and current[1].verdict is None:
        current[1].facts, current[1].verdict = facts, verdict


def live_platform_facts() -> PlatformFacts:
    """Facts for the platform vLLM detected in this process."""
    if (judging := _judging_for.get()) is not None and judging[0] != HERE:
        return target_platform_facts(judging[0])
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


def sparse_shape(model_config: ModelConfig) -> SparseShape:
    """The checkpoint's sparse-attention shape (the kernels' defaults if the
    checkpoint has no ``sparse_attention_config``)."""
    sparse = getattr(model_config.hf_text_config, "sparse_attention_config", None)
    if not sparse:
        return SparseShape()
    defaults = SparseShape()
    return SparseShape(
        topk_blocks=int(sparse.get("sparse_topk_blocks", defaults.topk_blocks)),
        sparse_block_size=int(
            sparse.get("sparse_block_size", defaults.sparse_block_size)
        ),
        index_head_dim=int(sparse.get("sparse_index_dim", defaults.index_head_dim)),
        score_type=str(sparse.get("sparse_score_type", defaults.score_type)),
    )


def sparse_layer_ids(model_config: ModelConfig) -> frozenset[int]:
    """The layers vLLM builds with sparse attention (and an index cache).

    As ``_sparse_attention_layer_ids`` in ``models/minimax_m3/{amd,nvidia}/
    model.py``: ``sparse_attention_freq`` alone; no model code reads
    ``use_sparse_attention``.
    """
    sparse = getattr(model_config.hf_text_config, "sparse_attention_config", None)
    freq = (sparse or {}).get("sparse_attention_freq")
    if freq is None:
        return frozenset()
    return frozenset(i for i, flag in enumerate(freq) if flag != 0)


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


def pool_layers(
    model_config: ModelConfig,
    cache_config: CacheConfig,
    pipeline_parallel_size: int = 1,
    speculative_config: Any = None,
) -> PoolLayers:
    """Which layers hold which caches, as vLLM's MiniMax-M3 model builds them."""
    num_layers = int(model_config.hf_text_config.num_hidden_layers)
    return PoolLayers(
        num_layers=num_layers,
        sparse=sparse_layer_ids(model_config),
        skip_requested=skip_layer_ids(cache_config),
        # MiniMaxM3MTP builds its one layer with force_sparse_attn=True.
        drafter_index_cache=_speculative_method(speculative_config) in MTP_METHODS,
        pp_stage_starts=_pp_stage_starts(num_layers, pipeline_parallel_size),
    )


# vLLM normalises "minimax_m3_mtp" to "mtp"; a MiniMax-M3 target's MTP drafter
# is always MiniMaxM3MTP.
MTP_METHODS = ("mtp", "minimax_m3_mtp")


def _speculative_method(speculative_config: Any) -> str | None:
    if speculative_config is None:
        return None
    if isinstance(speculative_config, dict):
        return speculative_config.get("method")
    return getattr(speculative_config, "method", None)


def checkpoint_quant_config(model_config: ModelConfig) -> Mapping[str, Any] | None:
    """The checkpoint's quantization config, where ``get_quant_config``
    (``model_executor/model_loader/weight_utils.py``) reads it: the HF
    config, else its text config, else compressed-tensors'
    ``compression_config``."""
    hf_config = model_config.hf_config
    quant = getattr(hf_config, "quantization_config", None)
    text_config = getattr(hf_config, "text_config", None)
    if quant is None and text_config is not None:
        quant = getattr(text_config, "quantization_config", None)
    if quant is None:
        quant = getattr(hf_config, "compression_config", None)
    if quant is not None and not isinstance(quant, Mapping):
        quant = quant.to_dict() if hasattr(quant, "to_dict") else None
    return quant


def checkpoint_kv_cache(model_config: ModelConfig) -> CheckpointKVCache | None:
    """The KV cache dtype the checkpoint declares, by vLLM's own rules."""
    quant = checkpoint_quant_config(model_config)
    if not quant:
        return None
    found = compressed_tensors_kv_cache(quant, model_config.quantization)
    if found is not None:
        return found
    # vLLM's own modelopt mapping, as resolve_kv_cache_dtype_string (called by
    # EngineArgs.create_engine_config) applies it to hf_config's config.
    hf_quant = getattr(model_config.hf_config, "quantization_config", None)
    if not str((hf_quant or {}).get("quant_method", "")).startswith("modelopt"):
        return None
    from vllm.utils.torch_utils import resolve_kv_cache_dtype_string

    return modelopt_kv_cache(
        hf_quant, resolve_kv_cache_dtype_string("auto", model_config)
    )


def main_kv_cache_dtype(
    model_config: ModelConfig, cache_config: CacheConfig, layers: PoolLayers
) -> MainKVCacheDtype:
    """What every main cache layer will store: the flag, or the checkpoint's
    declaration where vLLM applies it (``config/kv_cache_dtype.py``)."""
    return effective_main_kv_cache_dtype(
        str(cache_config.cache_dtype),
        checkpoint_kv_cache(model_config),
        # MiniMax-M3's dense layers are vLLM's generic Attention.
        builds_generic_attention=len(layers.sparse) < layers.num_layers,
    )


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
    """The policy's facts from vLLM's config objects (resolved or not)."""
    layers = pool_layers(
        model_config, cache_config, pipeline_parallel_size, speculative_config
    )
    main = main_kv_cache_dtype(model_config, cache_config, layers)
    return PrecisionFacts(
        platform=platform,
        kv_cache_dtype=main.dtype,
        # modelopt's auto was resolved before the hooks: record it as auto.
        kv_cache_flag="auto" if main.from_checkpoint else main.flag,
        kv_cache_source=(
            main.checkpoint.field
            if main.checkpoint is not None and main.auto != "auto"
            else None
        ),
        auto_kv_cache_dtype=None if main.auto == "auto" else main.auto,
        indexer_kv_dtype=str(attention_config.indexer_kv_dtype),
        max_model_len=int(model_config.max_model_len),
        shape=sparse_shape(model_config),
        tensor_parallel_size=int(tensor_parallel_size),
        kv_heads_per_rank=max(
            1,
            int(model_config.hf_text_config.num_key_value_heads)
            // tensor_parallel_size,
        ),
        indexer_cp=bool(attention_config.minimax_m3_indexer_cp),
        model_dtype=model_dtype_name(model_config),
        allow_mixed=allow_mixed_from_env(),
        draft_kv_cache_dtype=draft_kv_cache_dtype(speculative_config),
        layers=layers,
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


def draft_kv_cache_dtype(speculative_config: Any) -> str | None:
    """The drafter's own KV dtype from a SpeculativeConfig or its CLI dict."""
    if speculative_config is None:
        return None
    if isinstance(speculative_config, dict):
        value = speculative_config.get("kv_cache_dtype")
    else:
        value = getattr(speculative_config, "kv_cache_dtype", None)
    return None if value is None else str(value)
