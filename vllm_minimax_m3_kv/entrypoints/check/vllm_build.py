"""Stock vLLM's own model build and KV planning for one engine config,
on the meta device standing for the GPU.

``check`` runs these under the target's simulated platform
(:mod:`.target_platform`) to say what stock vLLM 0.33 builds for a command
with this plugin left out: the indexer vLLM selects, the specs each layer
returns, and what vLLM's planner makes of them. The test harness builds its
cells with the same functions.
"""

from __future__ import annotations

import contextlib
import copy
import socket
from dataclasses import dataclass, field, replace
from typing import Any

ATTENTION_BACKEND_ON_CPU = "TRITON_ATTN"
"""The backend a build here names when the command names none: backend
discovery would import GPU kernels (the MI355X recipe sets this one)."""
KV_MEMORY_BYTES = 8 << 30


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


_distributed_ready = False


def init_tp_group(tensor_parallel_size: int) -> None:
    """A one-process group that reports ``tensor_parallel_size`` ranks.

    Stands in for the GPUs of a TP group: layers read the TP size and rank
    from it to size their shards, so the model built here has rank 0's
    shapes. Nothing built on the meta device communicates.
    """
    global _distributed_ready
    from vllm.distributed import parallel_state

    if not _distributed_ready:
        parallel_state.init_distributed_environment(
            world_size=1,
            rank=0,
            local_rank=0,
            distributed_init_method=f"tcp://127.0.0.1:{_free_port()}",
            backend="gloo",
        )
        parallel_state.initialize_model_parallel(1, 1)
        _distributed_ready = True
    group = parallel_state.get_tp_group()
    group.world_size, group.rank_in_group = tensor_parallel_size, 0


@dataclass
class BuiltModel:
    specs: dict[str, Any]
    """Layer name -> the KV cache spec the worker would allocate for it."""
    draft_layers: set[str] = field(default_factory=set)
    """Layers the MTP drafter added (they share the target's block pool)."""
    selected: dict[str, Any] = field(default_factory=dict)


def _impl_names(model: Any) -> dict[str, Any]:
    modules = list(model.modules())
    return {
        "indexer_impls": sorted(
            {
                type(module.impl).__name__
                for module in modules
                if type(module).__name__.endswith("Indexer") and hasattr(module, "impl")
            }
        ),
        "main_impls": sorted(
            {
                type(module.impl).__name__
                for module in modules
                if hasattr(module, "indexer") and hasattr(module, "impl")
            }
        ),
        "aiter_sparse_pa": any(
            getattr(module, "use_aiter_sparse_pa", False) for module in modules
        ),
        # The dtype the layers allocate their index query in and index the
        # cache as (MiniMaxM3IndexerCache.dtype).
        "index_cache_dtypes": sorted(
            {
                str(module.dtype)
                for module in modules
                if type(module).__name__ == "MiniMaxM3IndexerCache"
            }
        ),
        "index_writer": _index_writer(model),
    }


def _index_writer(model: Any) -> str:
    """Which fused-insert op the model's module calls: vLLM's, or vLLM's
    wrapped by the plugin's fnuz index writer."""
    import sys

    module = sys.modules.get(type(model).__module__)
    ops = getattr(module, "ops", None)
    return type(ops).__name__ if ops is not None else "none"


@contextlib.contextmanager
def _pipeline_rank(rank: int | None, size: int):
    """The PP group as worker ``rank`` of ``size`` sees it (its first and last
    rank decide which layers it builds), restored afterwards."""
    from vllm.distributed import parallel_state

    if rank is None:
        yield
        return
    group = parallel_state.get_pp_group()
    saved = group.world_size, group.rank_in_group, group.ranks
    # This process is global rank 0; the other stages' ranks stand around it.
    group.world_size, group.rank_in_group = size, rank
    group.ranks = [group.rank + offset for offset in range(-rank, size - rank)]
    try:
        yield
    finally:
        group.world_size, group.rank_in_group, group.ranks = saved


def build_model(
    vllm_config: Any, bind_indexer: bool = False, pp_rank: int | None = None
) -> BuiltModel:
    """Build the real MiniMax-M3 (and its MTP drafter) on the meta device.

    With ``pp_rank``, as that pipeline stage's worker builds it: from its own
    copy of the config (a worker unpickles one), only its own layers.
    """
    import torch
    import vllm.model_executor.layers.fused_moe.runner.shared_experts as shared
    from vllm.config import get_layers_from_vllm_config, set_current_vllm_config
    from vllm.model_executor.layers.attention_layer_base import AttentionLayerBase
    from vllm.model_executor.models.utils import init_vllm_registered_model
    from vllm.utils.torch_utils import set_default_torch_dtype
    from vllm.v1.kv_cache_interface import AttentionSpec
    from vllm.v1.worker.utils import customize_attention_spec

    from vllm_minimax_m3_kv.config.facts import is_minimax_m3

    # The shared-experts side stream needs a GPU; nothing here runs on it.
    shared.aux_stream = lambda: None
    if pp_rank is not None:
        vllm_config = copy.deepcopy(vllm_config)
    stages = vllm_config.parallel_config.pipeline_parallel_size
    # As vLLM's loader builds it (model_loader/base_loader.py): the model's
    # dtype as the default, the device ("meta" standing for the GPU) too.
    loader_dtype = set_default_torch_dtype(vllm_config.model_config.dtype)
    with set_current_vllm_config(vllm_config), loader_dtype:
        init_tp_group(vllm_config.parallel_config.tensor_parallel_size)
        with torch.device("meta"), _pipeline_rank(pp_rank, stages):
            if is_minimax_m3(vllm_config.model_config):
                # The language model, built as the published VL checkpoint's
                # wrapper builds it (the vision tower holds no KV cache).
                model = init_vllm_registered_model(
                    vllm_config=vllm_config,
                    hf_config=vllm_config.model_config.hf_text_config,
                    prefix="language_model",
                    architectures=["MiniMaxM3SparseForCausalLM"],
                )
            else:  # another model (the tiny Llama), built as it is served
                model = init_vllm_registered_model(vllm_config=vllm_config)
    target_layers = set(get_layers_from_vllm_config(vllm_config, AttentionLayerBase))
    speculative = vllm_config.speculative_config
    selected = _impl_names(model)
    # The drafter runs on the last stage.
    if speculative is not None and pp_rank in (None, stages - 1):
        # As the proposer does: a copy of the config with its own attention
        # backend (re-running VllmConfig.__post_init__ and so the plugin hook).
        draft_config = replace(
            vllm_config,
            attention_config=replace(
                vllm_config.attention_config,
                backend=speculative.attention_backend or ATTENTION_BACKEND_ON_CPU,
            ),
        )
        if speculative.kv_cache_dtype is not None:
            # As llm_base_proposer._create_draft_vllm_config does.
            draft_config = replace(
                draft_config,
                cache_config=replace(
                    draft_config.cache_config, cache_dtype=speculative.kv_cache_dtype
                ),
            )
        draft_hf = speculative.draft_model_config.hf_config
        with (
            set_current_vllm_config(draft_config),
            set_default_torch_dtype(draft_config.model_config.dtype),
            torch.device("meta"),
        ):
            draft = init_vllm_registered_model(
                vllm_config=draft_config,
                hf_config=draft_hf,
                architectures=draft_hf.architectures,
            )
        selected["draft_indexer_impls"] = _impl_names(draft)["indexer_impls"]
    specs: dict[str, Any] = {}
    bound: dict[str, Any] = {}
    for name, layer in get_layers_from_vllm_config(
        vllm_config, AttentionLayerBase
    ).items():
        spec = layer.get_kv_cache_spec(vllm_config)
        if spec is None:
            continue
        if isinstance(spec, AttentionSpec):
            spec = customize_attention_spec(layer.get_attn_backend(), spec)
        specs[name] = spec
        if bind_indexer and name.endswith("index_cache"):
            # What the indexer kernels would index: bind a cache allocated the
            # way the worker allocates it, in the spec's storage dtype.
            layer.bind_kv_cache(torch.zeros((2, 1, 128, 128), dtype=spec.dtype))
            bound[name] = [str(layer.kv_cache.dtype), list(layer.kv_cache.shape)]
    if bind_indexer:
        selected["indexer_bound"] = bound
    return BuiltModel(specs, set(specs) - target_layers, selected)


def pp_stages(vllm_config: Any, built: BuiltModel, stages: int) -> list[dict]:
    """Split layer specs as vLLM's PP ranks own them; the drafter runs last."""
    from vllm.distributed.utils import get_pp_indices
    from vllm.model_executor.models.utils import extract_layer_index

    num_layers = vllm_config.model_config.hf_text_config.num_hidden_layers
    split: list[dict] = []
    for rank in range(stages):
        start, end = get_pp_indices(num_layers, rank, stages)
        split.append(
            {
                name: spec
                for name, spec in built.specs.items()
                if name not in built.draft_layers
                and start <= extract_layer_index(name) < end
            }
        )
    split[-1].update({name: built.specs[name] for name in built.draft_layers})
    return split


def kv_cache_configs(
    vllm_config: Any,
    stage_specs: list[dict[str, Any]],
    kv_memory_bytes: int = KV_MEMORY_BYTES,
) -> list[Any]:
    """vLLM's planner over per-stage specs, as the engine core runs it: the KV
    layout resolved first, then one ``KVCacheConfig`` per worker."""
    from vllm.config import set_current_vllm_config
    from vllm.distributed.kv_transfer.kv_connector.utils import (
        get_current_attn_backends,
    )
    from vllm.v1.attention.backends.utils import (
        get_supported_kv_cache_layouts,
        resolve_kv_cache_layout,
    )
    from vllm.v1.core.kv_cache_planning import (
        get_global_kv_cache_groups,
        get_kv_cache_configs,
    )

    with set_current_vllm_config(vllm_config):
        layouts = [
            layout.name
            for layout in get_supported_kv_cache_layouts(
                get_current_attn_backends(vllm_config)
            )
        ]
        all_specs = [spec for specs in stage_specs for spec in specs.values()]
        resolve_kv_cache_layout(vllm_config, [layouts] * len(stage_specs), all_specs)
        groups = get_global_kv_cache_groups(vllm_config, stage_specs)
        return get_kv_cache_configs(
            vllm_config, stage_specs, [kv_memory_bytes] * len(stage_specs), groups
        )


def plan(
    vllm_config: Any,
    stage_specs: list[dict[str, Any]],
    kv_memory_bytes: int = KV_MEMORY_BYTES,
) -> dict[str, Any]:
    """vLLM's planner over per-stage specs, summarised: who zeroes, capacity."""
    from vllm.config import set_current_vllm_config
    from vllm.v1.core.kv_cache_utils import (
        generate_scheduler_kv_cache_config,
        get_kv_cache_capacity,
    )

    configs = kv_cache_configs(vllm_config, stage_specs, kv_memory_bytes)
    with set_current_vllm_config(vllm_config):
        scheduler = generate_scheduler_kv_cache_config(configs)
        tokens, _ = get_kv_cache_capacity(vllm_config, scheduler)
    return {
        "workers": [config.needs_kv_cache_zeroing for config in configs],
        "worker_mixed": [config.has_mixed_precision_kv_cache for config in configs],
        "scheduler": scheduler.needs_kv_cache_zeroing,
        "num_blocks": configs[0].num_blocks,
        "tokens": tokens,
    }
