"""KV block zeroing as one decision for the whole engine (vLLM PR #64472).

vLLM 0.33 computes ``KVCacheConfig.needs_kv_cache_zeroing`` from the specs a
config holds. Each PP worker's config holds only its stage's layers, and the
scheduler's config keeps one spec per group, so a mixed-precision pool can give
``[False, True]`` across stages and ``False`` to the scheduler: the scheduler
never asks for new blocks to be zeroed (``python -m tests.reliability.zeroing``).
The HTTP 500 of #64472 (a stage without a zeroer asked to zero) needs a
scheduler that keeps worker 0's decision, which stock 0.33 does not have.
vLLM's Triton MiniMax-M3 kernels never read an unwritten slot
(``tests/kernels/test_stale_bytes.py``).

Here, as in #64472, the decision is computed once from every worker's full
config after planning, OR-ed across workers, and stored on each config; the
scheduler's projection is a deep copy of worker 0's config, so it keeps the
stored decision. Only MiniMax-M3 engines get a stored decision: every other
model reads vLLM's own property, unchanged.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from vllm_minimax_m3_kv._versions import PLUGIN_INSTALL, plugin_version

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


def predicted_pool(vllm_config: VllmConfig) -> str | None:
    """What the config-time decision said this pool would be, if one
    precision, e.g. "one precision: main cache fp8_e4m3, index cache fp8";
    None if it accepted a mixed pool, or made no decision on this config."""
    from vllm_minimax_m3_kv.config.recorded_verdict import recorded_verdict

    decided = recorded_verdict(vllm_config)
    return None if decided is None else decided.one_precision


def log_pool(
    configs: list[KVCacheConfig], zeroing: bool, predicted: str | None = None
) -> None:
    """One line per engine that says what the KV pool is (grep for it), and
    a warning where it is not what the config-time decision predicted."""
    from vllm_minimax_m3_kv._log import get_logger

    built = pool_precisions(configs)
    precisions = ", ".join(built)
    logger = get_logger(__name__)
    if predicted is not None and len(built) > 1:
        # A KV dtype source the config-time decision does not know of (e.g. a
        # node whose checkpoint copy differs): say what was expected and what
        # every worker will do about it.
        consequence = (
            f"every one of {len(configs)} workers and the scheduler zero newly "
            "allocated blocks"
            if zeroing
            else "each worker's own caches share one precision, so nothing is "
            "zeroed, but the pipeline stages store different precisions"
        )
        logger.warning(
            "MiniMax-M3 KV pool: the config-time decision predicted %s, but "
            "vLLM planned %s; %s. Run vllm-minimax-m3-kv check with this "
            "command on every node, and compare each node's checkpoint config.",
            predicted,
            precisions,
            consequence,
        )
        return
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


class PartialInstallError(RuntimeError):
    """A worker built MiniMax-M3 without this plugin (or another version)."""


def require_plugin_on_every_worker(
    vllm_config: VllmConfig, kv_cache_specs: list[dict[str, Any]]
) -> None:
    """Fail at KV planning if a worker's index cache has the stock description.

    The engine core plans from every worker's specs. With an fp8 e4m3 main
    cache this plugin describes the fp8 index cache like the main cache; a
    node without it (or with another version) reports ``float8_e4m3fn/NONE``,
    and its stage would run mixed.
    """
    import torch
    from vllm.v1.kv_cache_interface import KVQuantMode, SparseCacheRole

    from vllm_minimax_m3_kv.config.recorded_verdict import recorded_verdict

    decided = recorded_verdict(vllm_config)
    if decided is None or not decided.fp8_main_cache:
        return
    pp_size = vllm_config.parallel_config.pipeline_parallel_size
    per_stage = max(1, len(kv_cache_specs) // max(1, pp_size))
    for worker, specs in enumerate(kv_cache_specs):
        stock = [
            name
            for name, spec in specs.items()
            if getattr(spec, "cache_role", None) == SparseCacheRole.INDEXER
            and spec.dtype == torch.float8_e4m3fn
            and spec.kv_quant_mode == KVQuantMode.NONE
        ]
        if stock:
            version = plugin_version()
            raise PartialInstallError(
                f"MiniMax-M3 KV precision: worker {worker} (pipeline stage "
                f"{worker // per_stage} of {pp_size}) describes its fp8 index "
                f"cache ({stock[0]}, ...) as float8_e4m3fn/NONE, the stock vLLM "
                "description: that node runs without vllm-minimax-m3-kv "
                f"{version} (or with another version), so its stage would "
                "be mixed precision. Install the same version on every node, "
                "from the same checkout or wheel "
                f"({PLUGIN_INSTALL}), or run every node without it "
                "(VLLM_PLUGINS=)."
            )


def wrap_get_kv_cache_configs(original: Callable[..., Any]) -> Callable[..., Any]:
    """The planner, then one zeroing decision for MiniMax-M3 engines."""

    def get_kv_cache_configs(
        vllm_config: VllmConfig,
        kv_cache_specs: list[dict[str, Any]],
        *args: Any,
        **kwargs: Any,
    ) -> list[KVCacheConfig]:
        from vllm_minimax_m3_kv.config.facts import is_minimax_m3

        minimax_m3 = is_minimax_m3(vllm_config.model_config)
        if minimax_m3:
            require_plugin_on_every_worker(vllm_config, kv_cache_specs)
        configs = original(vllm_config, kv_cache_specs, *args, **kwargs)
        if minimax_m3:
            log_pool(configs, agree_on_zeroing(configs), predicted_pool(vllm_config))
        return configs

    get_kv_cache_configs.__wrapped__ = original  # type: ignore[attr-defined]
    get_kv_cache_configs.__doc__ = original.__doc__
    return get_kv_cache_configs
