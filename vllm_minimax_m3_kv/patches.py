"""Every change this plugin makes to vLLM, on one screen.

Each entry says why, how, which upstream PR it mirrors or awaits, and when to
delete it; how each finds and changes its site in vLLM is in
:mod:`~vllm_minimax_m3_kv.patch_sites`. ``detect`` runs at plugin load without
importing model or kernel code and recognises a site by its code (the names,
parameters and attributes the plugin calls or replaces), never by a message's
wording. A vLLM outside the supported range gets one warning and stock
behaviour. Within it, an entry whose site is not recognised stays out, with
every entry that ``requires`` it, and one warning names the site; the rest
apply, so the engine-wide zeroing decision keeps a mixed pool zeroed wherever
its own site is intact (docs/design.md, "When a site is missing").
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

from vllm_minimax_m3_kv._versions import vllm_version_problem
from vllm_minimax_m3_kv.patch_sites import (
    apply_config_hook,
    apply_env_table,
    apply_fnuz_index_writer,
    apply_fp8_balanced_decode,
    apply_indexer_cache,
    apply_rocm_fp8_triton_indexer,
    apply_zeroing_decision,
    detect_config_hook,
    detect_env_table,
    detect_fnuz_index_writer,
    detect_fp8_balanced_decode,
    detect_indexer_cache,
    detect_rocm_fp8_triton_indexer,
    detect_zeroing_decision,
    native_indexer_cache,
)


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
    requires: tuple[str, ...] = ()
    """Entries this one is unsafe without: it stays out when one of them does
    (a superseded entry counts as present: vLLM does it)."""


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
            "now, so every layer, PP stage and the engine core's planner read it. "
            "It records the decision under one key of additional_config "
            "(minimax_m3_kv), which vLLM carries to every worker; the later "
            "hooks read that instead of deciding again."
        ),
        upstream=(
            "Model-side alternative to vllm-project/vllm#64472 (scheduler keeps "
            "the zeroing decision, PP stages agree); builds on #54466 and #47287. "
            "The default is proposed natively in upstream/ PR 1, scoped to "
            "SM10x and gfx950's AITER MSA indexer, where evaluations exist (in "
            "MiniMax-M3's VerifyAndUpdateConfig entry); the wider default and "
            "the refusals stay here: vLLM's defaults should not refuse what "
            "starts today. upstream/ PR 3 gives every MiniMax-M3 layer the "
            "checkpoint's kv_cache_scheme per layer (refs vLLM #32843); the "
            "config-time resolution this hook reads stays here."
        ),
        remove_when=(
            "vLLM resolves MiniMax-M3's indexer dtype from --kv-cache-dtype (PR "
            "1) and vLLM PR #64472 zeroes mixed pools correctly, if the strict "
            "config-time refusals are no longer wanted."
        ),
        detect=detect_config_hook,
        apply=apply_config_hook,
        requires=(
            "minimax_m3_indexer_cache_storage",
            "minimax_m3_kv_zeroing_decision",
            "minimax_m3_kv_allow_mixed_env",
        ),
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
        detect=detect_indexer_cache,
        apply=apply_indexer_cache,
        superseded=native_indexer_cache,
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
            "minimax_m3_indexer_cp off, after the node self-test passes (once per "
            "process, in a context of its own inside vLLM's model build, a passed "
            "verdict kept per node: vllm_minimax_m3_kv.selftest_gate; "
            "VLLM_MINIMAX_M3_KV_SKIP_SELFTEST=1 skips it); not beside AITER "
            "sparse paged attention, whose kernels (or vLLM's unclamped Triton "
            "insert) would write the index cache; everything else asks "
            "vLLM's own selection. The ROCm MTP drafter's bf16-only check in "
            "MiniMaxM3MultiTokenPredictor.__init__ hears bf16 on that path; its "
            "layers still read the fp8 dtype."
        ),
        upstream=(
            "upstream/ PR 4 relaxes this gate and the MTP check for gfx950 "
            "through one ROCm function (vllm-project/vllm#53448, closed, did it "
            "inside a larger rework); gfx942 also awaits a fused insert that "
            "writes e4m3fnuz (minimax_m3_rocm_fnuz_index_writer)."
        ),
        remove_when=(
            "vLLM's select_indexer_impl_cls selects the Triton indexer for an "
            "fp8 index cache on ROCm gfx950 and gfx942 (and the ROCm MTP "
            "drafter allows it)."
        ),
        detect=detect_rocm_fp8_triton_indexer,
        apply=apply_rocm_fp8_triton_indexer,
        requires=("minimax_m3_config_hook",),
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
        detect=detect_fnuz_index_writer,
        apply=apply_fnuz_index_writer,
        requires=("minimax_m3_rocm_fp8_triton_indexer",),
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
            "faster is unmeasured (vllm-minimax-m3-kv bench on the node "
            "measures it)."
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
        detect=detect_fp8_balanced_decode,
        apply=apply_fp8_balanced_decode,
        requires=("minimax_m3_rocm_fp8_triton_indexer",),
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
        detect=detect_zeroing_decision,
        apply=apply_zeroing_decision,
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
        detect=detect_env_table,
        apply=apply_env_table,
    ),
)


@dataclass(frozen=True)
class Activation:
    """What register() does in this vLLM: entries to apply, entries vLLM
    already does (with what does it), and entries left out (with why)."""

    apply: tuple[Patch, ...]
    native: tuple[tuple[str, str], ...]
    left_out: tuple[tuple[str, str], ...]
    """Each entry left out and why: its site not recognised, or an entry it
    requires left out."""


def activation() -> Activation:
    """Which entries apply here: every entry vLLM does not already do whose
    site is recognised and whose requirements apply (each detected once)."""
    native, candidates = [], []
    for patch in PATCHES:
        if (found := patch.superseded()) is not None:
            native.append((patch.name, found))
        else:
            candidates.append(patch)
    left_out = {
        patch.name: f"not recognised: {why}"
        for patch in candidates
        if (why := patch.detect()) is not None
    }
    changed = True
    while changed:
        changed = False
        for patch in candidates:
            missing = [name for name in patch.requires if name in left_out]
            if patch.name not in left_out and missing:
                left_out[patch.name] = f"requires {', '.join(missing)}"
                changed = True
    return Activation(
        apply=tuple(p for p in candidates if p.name not in left_out),
        native=tuple(native),
        left_out=tuple(
            (p.name, left_out[p.name]) for p in candidates if p.name in left_out
        ),
    )


def unsupported_reasons() -> list[str]:
    """Why the plugin cannot load in this vLLM at all (its version); empty
    when it can. Entries left out one by one are :func:`activation`'s."""
    problem = vllm_version_problem()
    return [] if problem is None else [problem]
