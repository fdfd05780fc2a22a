"""Every change this plugin makes to vLLM, on one screen.

Each entry says why, how, which upstream PR it mirrors or awaits, and when to
delete it. ``detect`` runs at plugin load without importing model or kernel
code; only when every entry recognises the installed vLLM is anything applied,
so an unfamiliar vLLM gets one warning and stock behaviour, never half a patch.
An entry whose ``superseded`` finds the fix already in vLLM (``upstream/``
applied) is left out instead, and logged once, so the plugin retires entry by
entry. ``tests/test_plugin_load.py`` covers each entry, the end-to-end tests
in ``tests/models/`` fail if one stops working, and ``tests/upstream/`` runs
the plugin on a vLLM carrying the fix.

Outside this registry, and never while serving: the offline ``check`` command,
on a vLLM carrying the fix, runs the plugin's hook in place of vLLM's own
MiniMax-M3 decision for its one validation run, so it judges the target GPU,
then restores it (``entrypoints/check/judge.py``, ``_native_decision_stands_aside``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType

from vllm_minimax_m3_kv._import_hooks import when_imported
from vllm_minimax_m3_kv._versions import vllm_source_file, vllm_version_problem

INDEXER_MODULE = "vllm.models.minimax_m3.common.indexer"
MODELS_CONFIG_MODULE = "vllm.model_executor.models.config"
KV_CACHE_INTERFACE_MODULE = "vllm.v1.kv_cache_interface"
KV_CACHE_PLANNING_MODULE = "vllm.v1.core.kv_cache_planning"
KV_CACHE_UTILS_MODULE = "vllm.v1.core.kv_cache_utils"
ENGINE_CORE_MODULE = "vllm.v1.engine.core"
ENVS_MODULE = "vllm.envs"
AMD_MODEL_MODULE = "vllm.models.minimax_m3.amd.model"
AMD_MTP_MODULE = "vllm.models.minimax_m3.amd.mtp"
AMD_INDEX_TOPK_MODULE = "vllm.models.minimax_m3.amd.ops.index_topk"
CUSTOM_OPS_MODULE = "vllm._custom_ops"


@dataclass(frozen=True)
class Patch:
    name: str
    why: str
    how: str
    upstream: str
    remove_when: str
    detect: Callable[[], str | None]
    """None when the installed vLLM has what ``apply`` changes, else why not."""
    apply: Callable[[], None]
    superseded: Callable[[], str | None] = lambda: None
    """What in the installed vLLM already does this, or None. A superseded
    entry is neither detected nor applied: the plugin retires entry by entry
    as vLLM takes the fix (``upstream/``)."""


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


def _detect_config_hook() -> str | None:
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


def _apply_config_hook() -> None:
    # VllmConfig imports this module when it first verifies a model config;
    # importing it here would pull in vLLM's model registry at plugin load.
    when_imported(MODELS_CONFIG_MODULE, _patch_config_map)


# -- MiniMax-M3 indexer cache storage description ------------------------------


def _detect_indexer_cache() -> str | None:
    return _source_lacks(
        INDEXER_MODULE,
        "class MiniMaxM3IndexerCache",
        "def get_kv_cache_spec",
        "def bind_kv_cache",
        "cache_dtype = torch.float8_e4m3fn",
    )


def _native_indexer_cache() -> str | None:
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


def _apply_indexer_cache() -> None:
    when_imported(INDEXER_MODULE, _patch_indexer_cache)


# -- vLLM's Triton indexer with an fp8 index cache on ROCm gfx950 ------------


def _detect_rocm_fp8_triton_indexer() -> str | None:
    return (
        _source_lacks(
            INDEXER_MODULE,
            "def select_indexer_impl_cls(",
            "requires CUDA fp8 support.",
            "class MiniMaxM3IndexerTritonImpl",
        )
        # The ROCm model allocates the index query in the index cache's dtype
        # (the Triton dots take fp8 x fp8, not bf16 x fp8).
        or _source_lacks(AMD_MODEL_MODULE, "dtype=self.indexer.index_cache.dtype")
        or _source_lacks(
            AMD_MTP_MODULE,
            "class MiniMaxM3MultiTokenPredictor(",
            'indexer_kv_dtype != "bf16"',
            "has nowhere to go",
        )
    )


def _patch_indexer_selection(module: ModuleType) -> None:
    from vllm_minimax_m3_kv.model_executor.models.minimax_m3_rocm_fp8_triton_indexer import (
        wrap_select_indexer_impl_cls,
    )
    from vllm_minimax_m3_kv.selftest import check_node_once

    current = module.select_indexer_impl_cls
    if not hasattr(current, "__wrapped__"):
        module.select_indexer_impl_cls = wrap_select_indexer_impl_cls(
            current, module.MiniMaxM3IndexerTritonImpl, check_node_once
        )


def _patch_mtp_guard(module: ModuleType) -> None:
    from vllm_minimax_m3_kv.model_executor.models.minimax_m3_rocm_fp8_triton_indexer import (
        wrap_mtp_init,
    )

    predictor = module.MiniMaxM3MultiTokenPredictor
    if not hasattr(predictor.__init__, "__wrapped__"):
        predictor.__init__ = wrap_mtp_init(predictor.__init__)


def _apply_rocm_fp8_triton_indexer() -> None:
    when_imported(INDEXER_MODULE, _patch_indexer_selection)
    when_imported(AMD_MTP_MODULE, _patch_mtp_guard)


def _detect_fp8_balanced_decode() -> str | None:
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


def _apply_fp8_balanced_decode() -> None:
    # Read once, in the process that imports the kernels (each worker).
    when_imported(AMD_INDEX_TOPK_MODULE, _patch_decode_budget)


# -- the fnuz index writer on ROCm gfx942 ---------------------------------------


def _detect_fnuz_index_writer() -> str | None:
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
    from vllm.platforms import rocm

    if rocm.on_gfx942():
        module.ops = OpsWithFnuzIndexWriter(module.ops)


def _apply_fnuz_index_writer() -> None:
    # The ROCm model imports this module at model build, in each worker.
    when_imported(AMD_MODEL_MODULE, _patch_fnuz_index_writer)


# -- one KV zeroing decision per MiniMax-M3 engine (vLLM PR #64472) -----------


def _detect_zeroing_decision() -> str | None:
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


def _apply_zeroing_decision() -> None:
    when_imported(KV_CACHE_INTERFACE_MODULE, _patch_zeroing_property)
    when_imported(KV_CACHE_PLANNING_MODULE, _patch_planner)
    when_imported(ENGINE_CORE_MODULE, _patch_planner)


# -- the mixed-pool opt-in as a vLLM environment variable ---------------------


def _detect_env_table() -> str | None:
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


def _apply_env_table() -> None:
    when_imported(ENVS_MODULE, _register_env_variable)


PATCHES: tuple[Patch, ...] = (
    Patch(
        name="minimax_m3_config_hook",
        why=(
            "vLLM 0.33 resolves indexer_kv_dtype='auto' to bf16 for MiniMax-M3 "
            "whatever --kv-cache-dtype says, so an fp8 KV cache gets a bf16 "
            "indexer cache: a pool vLLM itself calls mixed, whose mixed workers "
            "build a KV block zeroer the scheduler never asks to run."
        ),
        how=(
            "When vllm.model_executor.models.config is imported, wraps its "
            "MODELS_CONFIG_MAP entries for the MiniMax-M3 architectures "
            "(vLLM's own entry runs first) to resolve 'auto' to fp8 where an fp8 "
            "indexer runs and raise a ValueError for every remaining mismatch. "
            "The decision reads the main KV dtype vLLM will build: where the "
            "checkpoint declares a compressed-tensors kv_cache_scheme and "
            "--kv-cache-dtype is auto, it writes the fp8 that vLLM's "
            "Attention.__init__ would write at model build into cache_config "
            "now, so every layer, PP stage and the engine core's planner read it."
        ),
        upstream=(
            "Model-side alternative to vllm-project/vllm#64472 (scheduler keeps "
            "the zeroing decision, PP stages agree); builds on #54466 and #47287. "
            "The default is proposed natively in upstream/ PR 1 (auto follows "
            "fp8 where an fp8 indexer runs, in MiniMax-M3's VerifyAndUpdateConfig "
            "entry); the refusals stay here: vLLM's defaults should not refuse "
            "what starts today. The early KV dtype resolution is proposed "
            "natively in upstream/ PR 3 (resolve_kv_cache_dtype_string resolves "
            "a compressed-tensors fp8 kv_cache_scheme as it already does "
            "modelopt's; refs vLLM #32843)."
        ),
        remove_when=(
            "vLLM resolves MiniMax-M3's indexer dtype from --kv-cache-dtype (PR "
            "1) and vLLM PR #64472 zeroes mixed pools correctly, if the strict "
            "config-time refusals are no longer wanted."
        ),
        detect=_detect_config_hook,
        apply=_apply_config_hook,
    ),
    Patch(
        name="minimax_m3_indexer_cache_storage",
        why=(
            "Even with both caches fp8 e4m3, vLLM 0.33 describes the main cache "
            "as (uint8, FP8_PER_TENSOR) and the indexer cache as "
            "(float8_e4m3fn, NONE), and KVCacheConfig.has_mixed_precision_kv_cache "
            "compares those pairs, so the pool still counts as mixed."
        ),
        how=(
            "When the indexer module is imported, an fp8 MiniMaxM3IndexerCache "
            "takes the platform's fp8 type (current_platform.fp8_dtype(): "
            "float8_e4m3fn, or float8_e4m3fnuz on gfx942, the main cache's "
            "own), get_kv_cache_spec reports the main cache's storage dtype and "
            "quant mode, and bind_kv_cache views the tensor back as that fp8 "
            "type. Same bytes, same page size, same kernel input."
        ),
        upstream=(
            "No upstream PR: the model-side description (upstream/ PR 2) is "
            "retired, since a core precision key that tells e4m3, e5m2 and "
            "fnuz apart is the fix a reviewer would take (docs/upstream.md). "
            "#64472 instead keeps zeroing on for mixed pools rather than "
            "making this pool uniform."
        ),
        remove_when=(
            "vLLM describes fp8 e4m3 caches one way, or compares storage bytes "
            "rather than (dtype, quant mode) pairs."
        ),
        detect=_detect_indexer_cache,
        apply=_apply_indexer_cache,
        superseded=_native_indexer_cache,
    ),
    Patch(
        name="minimax_m3_rocm_fp8_triton_indexer",
        why=(
            "On ROCm vLLM 0.33 runs an fp8 index cache only on the AITER MSA "
            "indexer (AITER sparse paged attention on, gfx950), which public "
            "MI355X recipes leave off below 8K input / concurrency 64, and on "
            "gfx942 (MI300X) it has none. Off it, "
            "select_indexer_impl_cls refuses fp8 only because the platform is "
            "not CUDA: the ROCm Triton scorers it would pick load K and Q in "
            "their stored dtype with fp32 accumulation (bit-exact against the "
            "same bytes in bf16, tests/kernels/test_rocm_fp8_triton_indexer.py)."
        ),
        how=(
            "When the indexer module is imported, select_indexer_impl_cls "
            "returns MiniMaxM3IndexerTritonImpl for an fp8 e4m3 index cache on "
            "ROCm gfx950 (e4m3fn) or gfx942 (e4m3fnuz) with "
            "minimax_m3_indexer_cp off, after the node "
            "self-test passes once per process (vllm_minimax_m3_kv.selftest; "
            "VLLM_MINIMAX_M3_KV_SKIP_SELFTEST=1 skips it); everything else asks "
            "vLLM's own selection. The ROCm MTP drafter's bf16-only check in "
            "MiniMaxM3MultiTokenPredictor.__init__ hears bf16 on that path; its "
            "layers still read the fp8 dtype."
        ),
        upstream=(
            "vllm-project/vllm#53448 (closed) relaxed this gate for gfx950; "
            "#47665 (open) adds fp8 to the Triton scorers. Awaits an upstream "
            "gate that admits ROCm fp8 where the Triton kernels run it."
        ),
        remove_when=(
            "vLLM's select_indexer_impl_cls selects the Triton indexer for an "
            "fp8 index cache on ROCm gfx950 and gfx942 (and the ROCm MTP "
            "drafter allows it)."
        ),
        detect=_detect_rocm_fp8_triton_indexer,
        apply=_apply_rocm_fp8_triton_indexer,
    ),
    Patch(
        name="minimax_m3_rocm_fnuz_index_writer",
        why=(
            "On gfx942 the fp8 KV cache is float8_e4m3fnuz, so the index cache "
            "beside it is too, and vLLM's fused insert "
            "(fused_minimax_m3_qknorm_rope_kv_insert) must not write it: its "
            "fp8 index store picks its type with #if defined(HIP_FP8_TYPE_OCP), "
            "which ROCm defines (as 0) on gfx942 too, so it would store the OCP "
            "e4m3fn encoding (or fail to build) there."
        ),
        how=(
            "On gfx942 only, the ROCm MiniMax-M3 model module's ops namespace "
            "routes a fused insert with an fnuz index cache through three "
            "launches (two more per sparse layer): vLLM's reuse-layer call "
            "(main norm, RoPE, K/V insert), vLLM's cache-free call (index "
            "norm and RoPE, index query in bf16), then one plugin Triton "
            "kernel that clamps the index key and query to vLLM's fnuz range "
            "(+-224) and casts them, scattering the key by the index slot "
            "mapping. Every other call, and gfx950 and CUDA, are untouched."
        ),
        upstream=(
            "None yet: the fused op's ROCm fp8 type should be chosen with "
            "__gfx942__ as vLLM's other fused kernels do (vllm-project/vllm"
            "#13851's convention); then the fused op can write fnuz itself."
        ),
        remove_when=(
            "vLLM's fused_minimax_m3_qknorm_rope_kv_insert writes "
            "float8_e4m3fnuz on gfx942 (checked by the node self-test's "
            "writer half against torch's clamp-and-cast)."
        ),
        detect=_detect_fnuz_index_writer,
        apply=_apply_fnuz_index_writer,
    ),
    Patch(
        name="minimax_m3_rocm_fp8_balanced_decode",
        why=(
            "vLLM's ROCm decode launch policy (_decode_score_program_budget in "
            "models/minimax_m3/amd/ops/index_topk.py) gives its tuned "
            "'balanced' score kernel to a bf16 index cache only, so an fp8 one "
            "takes split-K. On fp8 that kernel selects exactly the blocks it "
            "selects on the same values in bf16 (Triton's interpreter, "
            "tests/kernels/test_rocm_fp8_triton_indexer.py); whether it is "
            "faster is unmeasured (python -m benchmarks.decode_scorer on the "
            "node measures it)."
        ),
        how=(
            "Off unless VLLM_MINIMAX_M3_KV_FP8_BALANCED_DECODE=1 when a worker "
            "imports vLLM's ROCm index_topk module: then "
            "_decode_score_program_budget answers an fp8 e4m3 query and cache "
            "as it answers bf16 ones. Nothing else changes."
        ),
        upstream=(
            "None yet: a policy change for vLLM once a GPU measurement shows "
            "the balanced kernel pays on fp8."
        ),
        remove_when=(
            "vLLM's launch policy covers fp8, or a GPU measurement shows "
            "split-K is as fast for fp8 (then delete the entry and the variable)."
        ),
        detect=_detect_fp8_balanced_decode,
        apply=_apply_fp8_balanced_decode,
    ),
    Patch(
        name="minimax_m3_kv_zeroing_decision",
        why=(
            "Defense in depth, and what makes VLLM_MINIMAX_M3_KV_ALLOW_MIXED=1 "
            "safe: vLLM 0.33 derives needs_kv_cache_zeroing from each config's "
            "own specs, so with a mixed-precision pool PP stages disagree "
            "([False, True]) and the scheduler's projection says False, so no "
            "block is ever zeroed (python -m tests.reliability.zeroing); with "
            "#64472's original scheduler, which kept worker 0's decision, a "
            "stage without a zeroer was sent blocks to zero (HTTP 500)."
        ),
        how=(
            "KVCacheConfig.needs_kv_cache_zeroing returns a decision stored on "
            "the config when there is one, else vLLM's own computation. "
            "get_kv_cache_configs (in the planner and as the engine core "
            "imported it) stores, for MiniMax-M3 engines only, the OR of every "
            "worker's full-config decision on every worker's config; the "
            "scheduler config is a deep copy of worker 0's, so it keeps it. "
            "It also fails the startup, naming the worker and stage, when a "
            "worker reports the stock fp8 index-cache description (a node "
            "without this plugin), and logs one WARNING when the planned pool "
            "has more precisions than the config-time decision predicted (a KV "
            "dtype source it does not know), saying who now zeroes."
        ),
        upstream=(
            "Mirrors vllm-project/vllm#64472 (zeroing decided from each "
            "worker's full config, OR-ed across workers, preserved through "
            "generate_scheduler_kv_cache_config); extends #49623."
        ),
        remove_when="vLLM ships #64472 (a stored, engine-wide zeroing decision).",
        detect=_detect_zeroing_decision,
        apply=_apply_zeroing_decision,
    ),
    Patch(
        name="minimax_m3_kv_allow_mixed_env",
        why=(
            "VLLM_MINIMAX_M3_KV_ALLOW_MIXED, VLLM_MINIMAX_M3_KV_SKIP_SELFTEST "
            "and VLLM_MINIMAX_M3_KV_FP8_BALANCED_DECODE start with VLLM_, so "
            "vLLM's "
            "Platform.validate_environ warns that it is unknown, and with "
            "--fail-on-environ-validation refuses to start."
        ),
        how=(
            "Adds the variables to vllm.envs.environment_variables with the "
            "plugin's own parser, so vLLM knows the name and envs.<name> reads "
            "it as vLLM reads its own flags. Like every vLLM variable it then "
            "counts in vLLM's torch.compile cache key (envs.compile_factors)."
        ),
        upstream="None: a plugin-owned variable; no upstream change awaited.",
        remove_when=(
            "vLLM offers plugins a way to declare their environment variables."
        ),
        detect=_detect_env_table,
        apply=_apply_env_table,
    ),
)


def unsupported_reasons() -> list[str]:
    """Why the patches cannot be applied here; empty when they all can."""
    problem = vllm_version_problem()
    if problem is not None:
        return [problem]
    return [
        f"{p.name}: {why}"
        for p in PATCHES
        if p.superseded() is None and (why := p.detect()) is not None
    ]
