"""Run MiniMax-M3 scenarios through real vLLM 0.33 on a simulated platform.

``python -m tests.sim.runner --platform mi355x --scenarios in.json --out out.json``

Each scenario goes through ``EngineArgs(...).create_engine_config()`` (vLLM
loads this plugin from its entry point there, as ``vllm serve`` does), then
optionally builds the real MiniMax-M3 model on the meta device and runs vLLM's
KV planner on the specs its layers return, for PP=1 and a PP=2 stage split.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import socket
import sys
import traceback
from pathlib import Path
from typing import Any

from tests.sim.hardware import refresh_rocm_env, simulate

TINY_MODEL = str(Path(__file__).parents[1] / "data" / "minimax_m3_tiny")
KV_MEMORY_BYTES = 8 << 30


def _set_environment(values: dict[str, str | None]) -> None:
    for key, value in values.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
    refresh_rocm_env()


@contextlib.contextmanager
def _environment(changes: dict[str, str | None]):
    saved = {key: os.environ.get(key) for key in changes}
    _set_environment(changes)
    try:
        yield
    finally:
        _set_environment(saved)


def _unwrap(error: BaseException) -> BaseException:
    """The exception a config validator raised, out of pydantic's wrapper."""
    errors = getattr(error, "errors", None)
    if callable(errors):
        with contextlib.suppress(Exception):
            inner = errors()[0].get("ctx", {}).get("error")
            if isinstance(inner, BaseException):
                return inner
    return error


def _describe_error(error: BaseException) -> dict[str, Any]:
    from vllm_minimax_m3_kv.model_executor.models.config import IndexerPrecisionError

    inner = _unwrap(error)
    result: dict[str, Any] = {
        "type": type(inner).__name__,
        "message": str(inner),
        "from_plugin": isinstance(inner, IndexerPrecisionError),
        "fixes": [],
    }
    if isinstance(inner, IndexerPrecisionError):
        result["fixes"] = [
            {"flags": list(map(list, fix.flags)), "env": dict(fix.env)}
            for fix in inner.verdict.fixes
        ]
    return result


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


_distributed_ready = False


def _init_distributed() -> None:
    global _distributed_ready
    if _distributed_ready:
        return
    from vllm.distributed import (
        init_distributed_environment,
        initialize_model_parallel,
    )

    init_distributed_environment(
        world_size=1,
        rank=0,
        local_rank=0,
        distributed_init_method=f"tcp://127.0.0.1:{_free_port()}",
        backend="gloo",
    )
    initialize_model_parallel(1, 1)
    _distributed_ready = True


def _build_and_collect_specs(vllm_config: Any) -> tuple[dict[str, Any], dict]:
    """Build the real model on the meta device; return its layers' KV specs."""
    import torch
    import vllm.model_executor.layers.fused_moe.runner.shared_experts as shared
    from vllm.config import get_layers_from_vllm_config, set_current_vllm_config
    from vllm.model_executor.layers.attention_layer_base import AttentionLayerBase
    from vllm.model_executor.models.utils import init_vllm_registered_model
    from vllm.v1.kv_cache_interface import AttentionSpec
    from vllm.v1.worker.utils import customize_attention_spec

    # The shared-experts side stream needs a GPU; nothing here runs on it.
    shared.aux_stream = lambda: None
    with set_current_vllm_config(vllm_config):
        _init_distributed()
        with torch.device("meta"):
            model = init_vllm_registered_model(vllm_config=vllm_config)
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
        if name.endswith("index_cache"):
            # What the indexer kernels would index: bind a cache allocated the
            # way the worker allocates it, in the spec's storage dtype.
            layer.bind_kv_cache(torch.zeros((2, 1, 128, 128), dtype=spec.dtype))
            bound[name] = [str(layer.kv_cache.dtype), list(layer.kv_cache.shape)]
    selected = {
        "indexer_impls": sorted(
            {
                type(module.impl).__name__
                for module in model.modules()
                if type(module).__name__.endswith("Indexer") and hasattr(module, "impl")
            }
        ),
        "main_impls": sorted(
            {
                type(module.impl).__name__
                for module in model.modules()
                if hasattr(module, "indexer") and hasattr(module, "impl")
            }
        ),
        "aiter_sparse_pa": any(
            getattr(module, "use_aiter_sparse_pa", False) for module in model.modules()
        ),
        "indexer_bound": bound,
    }
    return specs, selected


def _plan(vllm_config: Any, stage_specs: list[dict[str, Any]]) -> dict[str, Any]:
    """vLLM's planner over per-stage specs, as the engine core runs it."""
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
    from vllm.v1.core.kv_cache_utils import generate_scheduler_kv_cache_config

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
        configs = get_kv_cache_configs(
            vllm_config, stage_specs, [KV_MEMORY_BYTES] * len(stage_specs), groups
        )
        scheduler = generate_scheduler_kv_cache_config(configs)
    return {
        "workers": [config.needs_kv_cache_zeroing for config in configs],
        "worker_mixed": [config.has_mixed_precision_kv_cache for config in configs],
        "scheduler": scheduler.needs_kv_cache_zeroing,
        "num_blocks": configs[0].num_blocks,
    }


def _pp_split(vllm_config: Any, specs: dict[str, Any], stages: int) -> list[dict]:
    from vllm.distributed.utils import get_pp_indices
    from vllm.model_executor.models.utils import extract_layer_index

    num_layers = vllm_config.model_config.hf_text_config.num_hidden_layers
    split = []
    for rank in range(stages):
        start, end = get_pp_indices(num_layers, rank, stages)
        split.append(
            {
                name: spec
                for name, spec in specs.items()
                if start <= extract_layer_index(name) < end
            }
        )
    return split


def run_scenario(scenario: dict[str, Any]) -> dict[str, Any]:
    from vllm.config.attention import AttentionConfig
    from vllm.engine.arg_utils import EngineArgs

    engine = dict(scenario.get("engine", {}))
    attention = dict(engine.pop("attention_config", {}))
    if scenario.get("set_backend", True):
        attention.setdefault("backend", "TRITON_ATTN")
    result: dict[str, Any] = {"id": scenario["id"]}
    with _environment(scenario.get("env", {})):
        try:
            args = EngineArgs(
                model=engine.pop("model", TINY_MODEL),
                skip_tokenizer_init=True,
                load_format="dummy",
                enforce_eager=True,
                block_size=128,
                attention_config=AttentionConfig(**attention),
                **engine,
            )
            vllm_config = args.create_engine_config()
        except Exception as error:
            result["config_error"] = _describe_error(error)
            return result
        result["kv_cache_dtype"] = vllm_config.cache_config.cache_dtype
        result["indexer_kv_dtype"] = vllm_config.attention_config.indexer_kv_dtype
        if not scenario.get("build", True):
            return result
        try:
            specs, selected = _build_and_collect_specs(vllm_config)
        except Exception as error:
            result["build_error"] = _describe_error(error)
            result["build_traceback"] = traceback.format_exc(limit=3)
            return result
        result.update(selected)
        result["specs"] = {
            name: [str(spec.dtype), spec.kv_quant_mode.name, spec.page_size_bytes]
            for name, spec in specs.items()
        }
        result["pp1"] = _plan(vllm_config, [specs])
        result["pp2"] = _plan(vllm_config, _pp_split(vllm_config, specs, 2))
    return result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--platform", required=True)
    parser.add_argument("--scenarios", required=True)
    parser.add_argument("--out", required=True)
    options = parser.parse_args()
    simulate(options.platform)
    scenarios = json.loads(Path(options.scenarios).read_text())
    results = [run_scenario(scenario) for scenario in scenarios]
    Path(options.out).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    sys.exit(main())
