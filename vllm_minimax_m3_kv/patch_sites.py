"""Where each :mod:`~vllm_minimax_m3_kv.patches` entry touches vLLM: how it
recognises the installed vLLM (``detect_*``: from vLLM's source, without
importing model or kernel code, by the code the entry calls or replaces:
definitions, parameters, attributes, never a message's wording) and how it
changes it (``apply_*``: hooks that run when vLLM imports the module, never at
plugin load).
"""

from __future__ import annotations

from types import ModuleType

from vllm_minimax_m3_kv._import_hooks import when_imported
from vllm_minimax_m3_kv._versions import vllm_source_file

INDEXER_MODULE = "vllm.models.minimax_m3.common.indexer"
MODELS_CONFIG_MODULE = "vllm.model_executor.models.config"
KV_CACHE_INTERFACE_MODULE = "vllm.v1.kv_cache_interface"
KV_CACHE_PLANNING_MODULE = "vllm.v1.core.kv_cache_planning"
KV_CACHE_UTILS_MODULE = "vllm.v1.core.kv_cache_utils"
ENGINE_CORE_MODULE = "vllm.v1.engine.core"
ENVS_MODULE = "vllm.envs"
AMD_MODEL_MODULE = "vllm.models.minimax_m3.amd.model"
AMD_MTP_MODULE = "vllm.models.minimax_m3.amd.mtp"
SPARSE_ATTENTION_MODULE = "vllm.models.minimax_m3.common.sparse_attention"
AMD_INDEX_TOPK_MODULE = "vllm.models.minimax_m3.amd.ops.index_topk"
CUSTOM_OPS_MODULE = "vllm._custom_ops"


def _source_lacks(module: str, *needles: str) -> str | None:
    path = vllm_source_file(module)
    if path is None:
        return f"{module} is missing"
    text = path.read_text(encoding="utf-8")
    missing = [needle for needle in needles if needle not in text]
    return f"{module} lacks {', '.join(missing)}" if missing else None


# -- MiniMax-M3 config hook ---------------------------------------------------

# What upstream/ PR 1 adds to vLLM's MiniMax-M3 config entries: the hook class
# that lets "auto" follow an fp8 KV cache. vLLM refuses nothing there, so the
# plugin's stricter hook stays, stacked after it.
NATIVE_HOOK_CLASS = "MiniMaxM3SparseForCausalLMConfig"


def native_hook_in_vllm() -> str | None:
    """vLLM's own MiniMax-M3 index-cache hook (upstream PR 1 or later), if any."""
    if _source_lacks(MODELS_CONFIG_MODULE, f"class {NATIVE_HOOK_CLASS}"):
        return None
    return f"{MODELS_CONFIG_MODULE}.{NATIVE_HOOK_CLASS}"


def detect_config_hook() -> str | None:
    return _source_lacks(
        MODELS_CONFIG_MODULE, "MODELS_CONFIG_MAP", "class VerifyAndUpdateConfig"
    ) or _source_lacks(
        "vllm.config.attention", "indexer_kv_dtype", "minimax_m3_indexer_cp"
    )


def _patch_config_map(module: ModuleType) -> None:
    from vllm_minimax_m3_kv.config.facts import MINIMAX_M3_ARCHITECTURES
    from vllm_minimax_m3_kv.model_executor.models.config import make_config_hook

    registry = module.MODELS_CONFIG_MAP
    for arch in MINIMAX_M3_ARCHITECTURES:
        stock = registry.get(arch)
        # Our hook classes carry `stock_hook`; wrapping one again would stack.
        if not hasattr(stock, "stock_hook"):
            registry[arch] = make_config_hook(stock)


def apply_config_hook() -> None:
    # VllmConfig imports this module when it first verifies a model config;
    # importing it here would pull in vLLM's model registry at plugin load.
    when_imported(MODELS_CONFIG_MODULE, _patch_config_map)


# -- MiniMax-M3 indexer cache storage description ------------------------------


def detect_indexer_cache() -> str | None:
    return _source_lacks(
        INDEXER_MODULE,
        "class MiniMaxM3IndexerCache",
        "def get_kv_cache_spec",
        "def bind_kv_cache",
        "cache_dtype = torch.float8_e4m3fn",
    )


def native_indexer_cache() -> str | None:
    # An index cache described like the main cache asks get_kv_quant_mode for
    # its description (the retired upstream PR 2 did); stock 0.33's indexer
    # module never calls it.
    if vllm_source_file(INDEXER_MODULE) is None or _source_lacks(
        INDEXER_MODULE, "get_kv_quant_mode("
    ):
        return None
    return "MiniMaxM3IndexerCache.get_kv_cache_spec"


def _patch_indexer_cache(module: ModuleType) -> None:
    from vllm_minimax_m3_kv.model_executor.models.minimax_m3_indexer_cache import (
        wrap_bind_kv_cache,
        wrap_get_kv_cache_spec,
        wrap_init,
    )

    cache_cls = module.MiniMaxM3IndexerCache
    if hasattr(cache_cls.get_kv_cache_spec, "__wrapped__"):
        return
    cache_cls.__init__ = wrap_init(cache_cls.__init__)
    cache_cls.get_kv_cache_spec = wrap_get_kv_cache_spec(cache_cls.get_kv_cache_spec)
    cache_cls.bind_kv_cache = wrap_bind_kv_cache(cache_cls.bind_kv_cache)


def apply_indexer_cache() -> None:
    when_imported(INDEXER_MODULE, _patch_indexer_cache)


# -- vLLM's Triton indexer with an fp8 index cache on ROCm gfx950 ------------


def detect_rocm_fp8_triton_indexer() -> str | None:
    return (
        # The selection the entry wraps (called by keyword) and the impl it
        # returns.
        _source_lacks(
            INDEXER_MODULE,
            "def select_indexer_impl_cls(",
            "topk_blocks: int,",
            "indexer_kv_dtype: IndexerKVDType | str",
            "class MiniMaxM3IndexerTritonImpl",
        )
        # The ROCm model allocates the index query in the index cache's dtype
        # (the Triton dots take fp8 x fp8, not bf16 x fp8).
        or _source_lacks(AMD_MODEL_MODULE, "dtype=self.indexer.index_cache.dtype")
        # Beside AITER sparse PA the gate stands aside.
        or _source_lacks(
            SPARSE_ATTENTION_MODULE, "def _minimax_m3_aiter_sparse_pa_requested("
        )
        # The drafter's inline bf16-only check the entry answers: the call it
        # makes where no MSA indexer is selected, to the method it wraps.
        or _source_lacks("vllm.config.attention", "def resolve_indexer_kv_dtype(")
        or _source_lacks(
            AMD_MTP_MODULE,
            "class MiniMaxM3MultiTokenPredictor(",
            "if indexer_ctx.msa_indexer_impl_cls is None:",
            'vllm_config.attention_config.resolve_indexer_kv_dtype(\n                "bf16"',
        )
    )


def _patch_indexer_selection(module: ModuleType) -> None:
    from vllm_minimax_m3_kv.model_executor.models.minimax_m3_rocm_fp8_triton_indexer import (
        wrap_select_indexer_impl_cls,
    )

    current = module.select_indexer_impl_cls
    if not hasattr(current, "__wrapped__"):
        module.select_indexer_impl_cls = wrap_select_indexer_impl_cls(
            current, module.MiniMaxM3IndexerTritonImpl, _check_node_once
        )


def _check_node_once() -> None:
    # Imported only where the ROCm fp8 path is selected: a CUDA worker never
    # loads the self-test.
    from vllm_minimax_m3_kv.selftest_gate import check_node_once

    check_node_once()


def _patch_mtp_guard(module: ModuleType) -> None:
    from vllm.config.attention import AttentionConfig

    from vllm_minimax_m3_kv.model_executor.models.minimax_m3_rocm_fp8_triton_indexer import (
        wrap_mtp_init,
        wrap_resolve_indexer_kv_dtype,
    )

    predictor = module.MiniMaxM3MultiTokenPredictor
    if not hasattr(predictor.__init__, "__wrapped__"):
        predictor.__init__ = wrap_mtp_init(predictor.__init__)
    resolve = AttentionConfig.resolve_indexer_kv_dtype
    if not hasattr(resolve, "__wrapped__"):
        AttentionConfig.resolve_indexer_kv_dtype = wrap_resolve_indexer_kv_dtype(
            resolve
        )


def apply_rocm_fp8_triton_indexer() -> None:
    when_imported(INDEXER_MODULE, _patch_indexer_selection)
    when_imported(AMD_MTP_MODULE, _patch_mtp_guard)


def detect_fp8_balanced_decode() -> str | None:
    return _source_lacks(
        AMD_INDEX_TOPK_MODULE,
        "def _decode_score_program_budget(",
        "and query_dtype == torch.bfloat16",
        "score_program_budget = _decode_score_program_budget(",
    )


def _patch_decode_budget(module: ModuleType) -> None:
    from vllm_minimax_m3_kv.envs import fp8_balanced_decode_from_env
    from vllm_minimax_m3_kv.model_executor.models.minimax_m3_rocm_fp8_triton_indexer import (
        wrap_decode_score_program_budget,
    )

    current = module._decode_score_program_budget
    if not hasattr(current, "__wrapped__") and fp8_balanced_decode_from_env():
        module._decode_score_program_budget = wrap_decode_score_program_budget(
            current, enabled=True
        )


def apply_fp8_balanced_decode() -> None:
    # Read once, in the process that imports the kernels (each worker).
    when_imported(AMD_INDEX_TOPK_MODULE, _patch_decode_budget)


# -- the fnuz index writer on ROCm gfx942 ---------------------------------------


def detect_fnuz_index_writer() -> str | None:
    return _source_lacks(
        AMD_MODEL_MODULE,
        "from vllm import _custom_ops as ops",
        "ops.fused_minimax_m3_qknorm_rope_kv_insert(",
        # The two call shapes the writer reuses: reuse layers, AITER branch.
        "skip_index_branch=True,",
        "index_q_out=index_q,",
    ) or _source_lacks(
        CUSTOM_OPS_MODULE,
        "def fused_minimax_m3_qknorm_rope_kv_insert(",
        "index_slot_mapping: torch.Tensor | None = None,",
        "index_q_out: torch.Tensor | None = None,",
        "skip_index_branch: bool = False,",
    )


def _patch_fnuz_index_writer(module: ModuleType) -> None:
    from vllm.platforms import current_platform

    from vllm_minimax_m3_kv.model_executor.models.minimax_m3_rocm_fnuz_index_writer import (
        OpsWithFnuzIndexWriter,
    )

    if not current_platform.is_rocm() or isinstance(module.ops, OpsWithFnuzIndexWriter):
        return
    if current_platform.is_fp8_fnuz():
        module.ops = OpsWithFnuzIndexWriter(module.ops)


def apply_fnuz_index_writer() -> None:
    # The ROCm model imports this module at model build, in each worker.
    when_imported(AMD_MODEL_MODULE, _patch_fnuz_index_writer)


# -- one KV zeroing decision per MiniMax-M3 engine (vLLM PR #64472) -----------


def detect_zeroing_decision() -> str | None:
    return (
        _source_lacks(
            KV_CACHE_INTERFACE_MODULE,
            "class KVCacheConfig",
            "def needs_kv_cache_zeroing",
            "def has_mixed_precision_kv_cache",
        )
        or _source_lacks(KV_CACHE_PLANNING_MODULE, "def get_kv_cache_configs(")
        # The scheduler's config must be a copy of a worker's, so that the
        # decision stored on it survives the projection.
        or _source_lacks(KV_CACHE_UTILS_MODULE, "copy.deepcopy(kv_cache_configs[0])")
        or _source_lacks(
            ENGINE_CORE_MODULE,
            "get_kv_cache_configs,",
            "generate_scheduler_kv_cache_config(kv_cache_configs)",
        )
    )


def _patch_zeroing_property(module: ModuleType) -> None:
    from vllm_minimax_m3_kv.v1.core.kv_cache_zeroing import stored_or_computed

    config_cls = module.KVCacheConfig
    current = config_cls.needs_kv_cache_zeroing
    if not hasattr(current.fget, "__wrapped__"):
        config_cls.needs_kv_cache_zeroing = stored_or_computed(current.fget)


def _patch_planner(module: ModuleType) -> None:
    # The planning module and the engine core (which imported the function by
    # name, often before any plugin loads) each get the wrapped planner.
    from vllm_minimax_m3_kv.v1.core.kv_cache_zeroing import (
        wrap_get_kv_cache_configs,
    )

    current = module.get_kv_cache_configs
    if not hasattr(current, "__wrapped__"):
        module.get_kv_cache_configs = wrap_get_kv_cache_configs(current)


def apply_zeroing_decision() -> None:
    when_imported(KV_CACHE_INTERFACE_MODULE, _patch_zeroing_property)
    when_imported(KV_CACHE_PLANNING_MODULE, _patch_planner)
    when_imported(ENGINE_CORE_MODULE, _patch_planner)


# -- the mixed-pool opt-in as a vLLM environment variable ---------------------


def detect_env_table() -> str | None:
    return _source_lacks(
        ENVS_MODULE, "environment_variables: dict[str, Callable[[], Any]]"
    ) or _source_lacks(
        "vllm.platforms.interface", "env not in envs.environment_variables"
    )


def _register_env_variable(module: ModuleType) -> None:
    from vllm_minimax_m3_kv.envs import (
        ALLOW_MIXED_ENV,
        FP8_BALANCED_DECODE_ENV,
        SKIP_SELFTEST_ENV,
        allow_mixed_from_env,
        fp8_balanced_decode_from_env,
        skip_selftest_from_env,
    )

    table = module.environment_variables
    table.setdefault(ALLOW_MIXED_ENV, allow_mixed_from_env)
    table.setdefault(SKIP_SELFTEST_ENV, skip_selftest_from_env)
    table.setdefault(FP8_BALANCED_DECODE_ENV, fp8_balanced_decode_from_env)


def apply_env_table() -> None:
    when_imported(ENVS_MODULE, _register_env_variable)
