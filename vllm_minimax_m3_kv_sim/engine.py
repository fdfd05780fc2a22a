"""Real vLLM 0.33 steps for one MiniMax-M3 configuration, on a simulated platform.

Config (``EngineArgs.create_engine_config``, which loads this plugin from its
entry point as ``vllm serve`` does), the model on the meta device, and vLLM's
KV planner on the specs its layers return. Shared by the scenario runner, the
reliability matrix and the benchmarks; call ``vllm_minimax_m3_kv_sim.hardware.simulate``
first.
"""

from __future__ import annotations

import contextlib
import os
from typing import Any

# The build and planning steps are the product's own (check asks stock vLLM
# with them); re-exported here for the harness.
from vllm_minimax_m3_kv.entrypoints.check.vllm_build import (
    ATTENTION_BACKEND_ON_CPU,
    KV_MEMORY_BYTES,
    BuiltModel,
    build_model,
    init_tp_group,
    kv_cache_configs,
    plan,
    pp_stages,
)
from vllm_minimax_m3_kv_sim import REPO
from vllm_minimax_m3_kv_sim.hardware import refresh_rocm_env

TINY_MODEL = str(REPO / "tests" / "data" / "minimax_m3_tiny")
# The same model with its two sparse layers first, in PP stage 0 of 2.
TINY_MODEL_SPARSE_FIRST = str(REPO / "tests" / "data" / "minimax_m3_tiny_sparse_first")
# The published layout and the sparse-first one, each with llm-compressor's
# FP8 KV recipe (compressed-tensors kv_cache_scheme, no weight scheme); and a
# modelopt FP8 checkpoint with an FP8 KV cache (kv_cache_quant_algo).
TINY_CT_FP8_KV = str(REPO / "tests" / "data" / "minimax_m3_tiny_ct_fp8_kv")
TINY_CT_FP8_KV_SPARSE_FIRST = str(
    REPO / "tests" / "data" / "minimax_m3_tiny_ct_fp8_kv_sparse_first"
)
TINY_MODELOPT_FP8 = str(REPO / "tests" / "data" / "minimax_m3_tiny_modelopt_fp8")
TINY_LLAMA = str(REPO / "tests" / "data" / "llama_tiny")
BUNDLED_MODEL = str(REPO / "vllm_minimax_m3_kv" / "data" / "minimax_m3")
# What the MI355X recipe sets; backend discovery would import GPU kernels.
SIM_ATTENTION_BACKEND = ATTENTION_BACKEND_ON_CPU


__all__ = [
    "KV_MEMORY_BYTES",
    "BuiltModel",
    "build_model",
    "kv_cache_configs",
    "plan",
    "pp_stages",
]


def set_environment(values: dict[str, str | None]) -> None:
    for key, value in values.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
    refresh_rocm_env()


@contextlib.contextmanager
def environment(changes: dict[str, str | None]):
    saved = {key: os.environ.get(key) for key in changes}
    set_environment(changes)
    try:
        yield
    finally:
        set_environment(saved)


def unwrap(error: BaseException) -> BaseException:
    """The exception a config validator raised, out of pydantic's wrapper."""
    from vllm_minimax_m3_kv.entrypoints.check.judge import validation_cause

    return validation_cause(error)


def describe_error(error: BaseException) -> dict[str, Any]:
    from vllm_minimax_m3_kv.model_executor.models.config import IndexerPrecisionError

    inner = unwrap(error)
    result: dict[str, Any] = {
        "type": type(inner).__name__,
        "message": str(inner),
        "from_plugin": isinstance(inner, IndexerPrecisionError),
        "fixes": [],
    }
    if isinstance(inner, IndexerPrecisionError):
        result["fixes"] = [
            {
                "flags": list(map(list, fix.flags)),
                "env": dict(fix.env),
                "requires": list(fix.requires),
                "without": list(fix.without),
            }
            for fix in inner.verdict.fixes
        ]
    return result


def make_engine_args(engine: dict[str, Any], set_backend: bool = True):
    from vllm.config.attention import AttentionConfig
    from vllm.engine.arg_utils import EngineArgs

    engine = dict(engine)
    attention = dict(engine.pop("attention_config", {}))
    if set_backend:
        attention.setdefault("backend", SIM_ATTENTION_BACKEND)
    return EngineArgs(
        model=engine.pop("model", TINY_MODEL),
        skip_tokenizer_init=True,
        load_format="dummy",
        enforce_eager=True,
        block_size=engine.pop("block_size", 128),
        attention_config=AttentionConfig(**attention),
        **engine,
    )


def cp_indexer_selection_error(
    vllm_config: Any, built: BuiltModel
) -> dict[str, Any] | None:
    """What vLLM's indexer selection says with indexer CP on, for a model
    built with it off (the CP indexers map peer GPU memory at build).

    The neutral indexer asks ``select_indexer_impl_cls`` under the engine's
    own config: with CP on, that is where an index cache dtype other than
    bf16 is refused. The MSA indexer handles CP itself and never asks it."""
    if not vllm_config.attention_config.minimax_m3_indexer_cp:
        return None
    selected = built.selected.get("indexer_impls", [])
    if not selected or any("MSA" in name for name in selected):
        return None
    from vllm.config import set_current_vllm_config
    from vllm.models.minimax_m3.common import indexer

    sparse = vllm_config.model_config.hf_text_config.sparse_attention_config
    init_tp_group(vllm_config.parallel_config.tensor_parallel_size)
    dtype = vllm_config.attention_config.resolve_indexer_kv_dtype("bf16")
    with set_current_vllm_config(vllm_config):
        try:
            indexer.select_indexer_impl_cls(
                topk_blocks=int(sparse["sparse_topk_blocks"]), indexer_kv_dtype=dtype
            )
        except (ValueError, NotImplementedError) as error:
            return describe_error(error)
    return None


def spec_summary(specs: dict[str, Any]) -> dict[str, list]:
    return {
        name: [str(spec.dtype), spec.kv_quant_mode.name, spec.page_size_bytes]
        for name, spec in specs.items()
    }
