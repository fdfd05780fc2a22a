"""KV block zeroing as one decision for the whole engine (vLLM PR #64472).

vLLM 0.33 computes ``KVCacheConfig.needs_kv_cache_zeroing`` from the specs a
config holds. Each PP worker's config holds only its stage's layers, and the
scheduler's config keeps one spec per group, so a mixed-precision pool can give
``[False, True]`` across stages and ``False`` to the scheduler: new blocks are
never zeroed (stale bytes decode to NaN), or a stage without a zeroer receives
blocks to zero (HTTP 500).

Here, as in #64472, the decision is computed once from every worker's full
config after planning, OR-ed across workers, and stored on each config; the
scheduler's projection is a deep copy of worker 0's config, so it keeps the
stored decision. Only MiniMax-M3 engines get a stored decision: every other
model reads vLLM's own property, unchanged.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.v1.kv_cache_interface import KVCacheConfig

ZEROING_DECISION = "_minimax_m3_kv_needs_zeroing"
"""Instance attribute holding the engine-wide decision (survives deepcopy and
pickling to workers)."""


def stored_or_computed(
    computed: Callable[[KVCacheConfig], bool],
) -> property:
    """``needs_kv_cache_zeroing`` that prefers the engine-wide decision."""

    def needs_kv_cache_zeroing(self: KVCacheConfig) -> bool:
        stored = self.__dict__.get(ZEROING_DECISION)
        return computed(self) if stored is None else stored

    needs_kv_cache_zeroing.__doc__ = computed.__doc__
    needs_kv_cache_zeroing.__wrapped__ = computed  # type: ignore[attr-defined]
    return property(needs_kv_cache_zeroing)


def agree_on_zeroing(configs: list[KVCacheConfig]) -> bool:
    """Store one decision on every worker's config: zero if any worker must."""
    decision = any(config.needs_kv_cache_zeroing for config in configs)
    for config in configs:
        config.__dict__[ZEROING_DECISION] = decision
    return decision


def pool_precisions(configs: list[KVCacheConfig]) -> list[str]:
    """Every (storage dtype / quant mode) of the device attention caches."""
    from vllm.v1.kv_cache_interface import AttentionSpec, iter_layer_specs

    return sorted(
        {
            f"{str(spec.dtype).removeprefix('torch.')}/{spec.kv_quant_mode.name}"
            for config in configs
            for group in config.kv_cache_groups
            if not group.host_resident
            for spec in iter_layer_specs(group.kv_cache_spec)
            if isinstance(spec, AttentionSpec)
        }
    )


def log_pool(configs: list[KVCacheConfig], zeroing: bool) -> None:
    """One line per engine that says what the KV pool is (grep for it)."""
    from vllm_minimax_m3_kv._log import get_logger

    precisions = ", ".join(pool_precisions(configs))
    logger = get_logger(__name__)
    if not zeroing:
        logger.info(
            "MiniMax-M3 KV pool: one precision (%s) on all %d workers; no KV "
            "block zeroer is built.",
            precisions,
            len(configs),
        )
    else:
        logger.warning(
            "MiniMax-M3 KV pool: mixed precision (%s); every one of %d workers "
            "and the scheduler zero newly allocated blocks.",
            precisions,
            len(configs),
        )


def wrap_get_kv_cache_configs(original: Callable[..., Any]) -> Callable[..., Any]:
    """The planner, then one zeroing decision for MiniMax-M3 engines."""

    def get_kv_cache_configs(
        vllm_config: VllmConfig, *args: Any, **kwargs: Any
    ) -> list[KVCacheConfig]:
        from vllm_minimax_m3_kv.config.facts import is_minimax_m3

        configs = original(vllm_config, *args, **kwargs)
        if is_minimax_m3(vllm_config.model_config):
            log_pool(configs, agree_on_zeroing(configs))
        return configs

    get_kv_cache_configs.__wrapped__ = original  # type: ignore[attr-defined]
    get_kv_cache_configs.__doc__ = original.__doc__
    return get_kv_cache_configs
