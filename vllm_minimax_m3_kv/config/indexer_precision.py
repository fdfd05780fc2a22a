"""MiniMax-M3 KV pool precision: the policy, as one pure function.

The question, for every main KV cache dtype vLLM accepts: will the two caches
of a MiniMax-M3 pool (main K/V and the sparse indexer's K) have one precision?
Facts in (platform, flags, model shape, parallelism), verdict out (the indexer
dtype to run with, or why the two caches cannot share one precision and how to
fix it; or, with the operator's explicit opt-in, a mixed pool that vLLM then
zeroes safely). Nothing here imports vLLM: the live config hook and the offline
``check`` command both gather facts and call :func:`decide`, so they cannot
disagree.

The rules for "does an fp8 indexer exist here" restate vLLM 0.33's own gates,
which read the live platform and so cannot judge another machine:
``msa_indexer_unsupported_reason`` (``models/minimax_m3/amd/indexer_msa.py``),
``select_indexer_impl_cls`` (``models/minimax_m3/common/indexer.py``) and
``_minimax_m3_aiter_sparse_pa_requested``
(``models/minimax_m3/common/sparse_attention.py``).
``tests/config/test_vllm_gate_contract.py`` pins each rule to those functions
under simulated MI355X, MI300X and SM100 platforms.

Each rule is a named entry in ``FP8_INDEXER_RULES``, ``PAIRING_RULES`` or
``DRAFTER_RULES``, so
the reliability matrix (``tests/reliability/``) can take any one out and show
a configuration that then fails: none is dead weight.
"""

from __future__ import annotations

import enum
import functools
import math
import shlex
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Literal

from vllm_minimax_m3_kv.envs import ALLOW_MIXED_ENV

# KV cache dtypes whose bytes are fp8 e4m3, the format every fp8 indexer stores.
FP8_E4M3_KV_CACHE_DTYPES = frozenset({"fp8", "fp8_e4m3"})
FP8_INDEXER_DTYPES = frozenset({"fp8", "fp8_e4m3"})
# vLLM resolves "auto" to this for MiniMax-M3 (``resolve_indexer_kv_dtype``).
STOCK_INDEXER_DEFAULT = "bf16"
# The only dtypes vLLM 0.33's MiniMaxM3IndexerCache stores: bf16 and fp8 e4m3.
BF16_INDEXER_DTYPES = frozenset({"auto", "bf16"})
BF16 = "bfloat16"

# Shape contract of the AITER MSA indexer (vLLM 0.33 ``indexer_msa.py``).
MSA_TOPK_BLOCKS = 16
MSA_SPARSE_BLOCK_SIZE = 128
MSA_INDEX_HEAD_DIM = 128
MSA_SCORE_TYPE = "max"
# SLOTS_MAX * WAVE_SIZE: the most blocks one top-k row can span.
MSA_MAX_BLOCKS_PER_ROW = 128 * 64

AITER_ENV = "VLLM_ROCM_USE_AITER"
SHUFFLE_KV_ENV = "VLLM_ROCM_SHUFFLE_KV_CACHE_LAYOUT"
KV_CACHE_DTYPE_FLAG = "--kv-cache-dtype"
INDEXER_KV_DTYPE_FLAG = "--attention-config.indexer_kv_dtype"
INDEXER_CP_FLAG = "--attention-config.minimax_m3_indexer_cp"
MAX_MODEL_LEN_FLAG = "--max-model-len"
DTYPE_FLAG = "--dtype"
DRAFT_KV_CACHE_DTYPE_FLAG = "--speculative-config.kv_cache_dtype"
SKIP_LAYERS_FLAG = "--kv-cache-dtype-skip-layers"


@dataclass(frozen=True)
class PlatformFacts:
    """What the policy needs to know about the accelerator and its env."""

    name: str
    """For messages, e.g. ``"ROCm gfx950 (MI355X)"``."""
    vendor: Literal["rocm", "cuda", "other"]
    rocm_gfx950: bool = False
    rocm_gfx942: bool = False
    """MI300X/MI325X: vLLM's fp8 type there is e4m3fnuz."""
    cuda_supports_fp8: bool = False
    cuda_sm100_family: bool = False
    aiter_enabled: bool = False
    """``VLLM_ROCM_USE_AITER`` as the user set it."""
    shuffle_kv_cache_layout: bool = False
    """``VLLM_ROCM_SHUFFLE_KV_CACHE_LAYOUT`` as the user set it."""
    aiter_installed: bool = True
    """The aiter package is importable and supports this GPU (vLLM's
    ``is_aiter_found_and_supported``); without it every AITER switch is off."""
    aiter_msa_kernels: bool = True
    """The installed aiter ships the MSA kernels the fp8 indexer imports."""
    unset_env: frozenset[str] = frozenset()
    """AITER variables absent from the environment (messages say "unset",
    not "=0", for them)."""

    @property
    def fp8_e4m3_format(self) -> str:
        """The e4m3 flavour vLLM stores "fp8" caches in here
        (``current_platform.fp8_dtype()``): fnuz on gfx942, OCP elsewhere."""
        return "e4m3fnuz" if self.vendor == "rocm" and self.rocm_gfx942 else "e4m3fn"

    @property
    def aiter_sparse_pa(self) -> bool:
        """AITER sparse paged attention will run (what vLLM's gate computes)."""
        return (
            self.vendor == "rocm"
            and self.aiter_installed
            and self.aiter_enabled
            and self.shuffle_kv_cache_layout
        )


@dataclass(frozen=True)
class SparseShape:
    """The checkpoint's ``sparse_attention_config`` values the kernels care about."""

    topk_blocks: int = MSA_TOPK_BLOCKS
    sparse_block_size: int = MSA_SPARSE_BLOCK_SIZE
    index_head_dim: int = MSA_INDEX_HEAD_DIM
    score_type: str = MSA_SCORE_TYPE


@dataclass(frozen=True)
class PoolLayers:
    """Which layers put which caches in the pool, as vLLM's model code builds
    them (not as config keys describe them)."""

    num_layers: int = 1
    sparse: frozenset[int] = frozenset({0})
    """Layers built with sparse attention, hence an index cache: vLLM reads
    ``sparse_attention_freq`` alone (``_sparse_attention_layer_ids``)."""
    skip_requested: frozenset[int] = frozenset()
    """Layer indices in ``--kv-cache-dtype-skip-layers`` after vLLM's own
    additions (TurboQuant boundary layers)."""
    drafter_index_cache: bool = False
    """The MiniMax-M3 MTP drafter builds its layer sparse whatever the
    checkpoint says, so its index cache joins the pool."""
    pp_stage_starts: tuple[int, ...] = (0,)
    """First layer of each pipeline stage (vLLM's ``get_pp_indices``)."""

    @property
    def has_index_cache(self) -> bool:
        return bool(self.sparse) or self.drafter_index_cache

    @property
    def skipped_dense(self) -> tuple[int, ...]:
        """Layers whose main cache vLLM's generic ``Attention`` keeps at the
        model dtype (the dense layers named by the skip list)."""
        return tuple(
            sorted(i for i in self.skip_requested - self.sparse if i < self.num_layers)
        )

    @property
    def skip_ignored(self) -> tuple[int, ...]:
        """Sparse layers named by the skip list: MiniMax-M3's sparse attention
        keeps the main cache dtype for them."""
        return tuple(sorted(self.skip_requested & self.sparse))

    def stage_of(self, layer: int) -> int:
        return sum(1 for start in self.pp_stage_starts[1:] if layer >= start)

    def describe(self, layers: tuple[int, ...]) -> str:
        named = ", ".join(map(str, layers))
        stages = len(self.pp_stage_starts)
        if stages == 1:
            return f"layer{'s' if len(layers) > 1 else ''} {named}"
        where = sorted({self.stage_of(layer) for layer in layers})
        return (
            f"layer{'s' if len(layers) > 1 else ''} {named} (pipeline stage"
            f"{'s' if len(where) > 1 else ''} {', '.join(map(str, where))} of "
            f"{stages})"
        )


@dataclass(frozen=True)
class PrecisionFacts:
    platform: PlatformFacts
    kv_cache_dtype: str
    """The main cache dtype every layer will store (``auto``: the model
    dtype): ``--kv-cache-dtype``, or the checkpoint's declared KV cache where
    vLLM gives it to ``auto`` (``config/kv_cache_dtype.py``)."""
    indexer_kv_dtype: str
    """``attention_config.indexer_kv_dtype`` as given (``auto`` when unset)."""
    max_model_len: int
    shape: SparseShape = field(default_factory=SparseShape)
    tensor_parallel_size: int = 1
    kv_heads_per_rank: int = 1
    """The main cache's KV heads on one TP rank (vLLM replicates below one)."""
    indexer_cp: bool = False
    """``attention_config.minimax_m3_indexer_cp``."""
    model_dtype: str = BF16
    """The model's dtype (``--dtype`` resolved): what ``--kv-cache-dtype auto``
    stores in the main cache."""
    allow_mixed: bool = False
    """``VLLM_MINIMAX_M3_KV_ALLOW_MIXED`` as the plugin reads it."""
    draft_kv_cache_dtype: str | None = None
    """``speculative_config.kv_cache_dtype``: the MTP drafter's own main cache
    dtype, in the same block pool (None: it inherits the target's)."""
    layers: PoolLayers = field(default_factory=PoolLayers)
    kv_cache_flag: str | None = None
    """``--kv-cache-dtype`` as the config holds it when the hooks run (None:
    the same as ``kv_cache_dtype``); for messages."""
    kv_cache_source: str | None = None
    """The checkpoint field that declares what ``auto`` gives (with
    ``auto_kv_cache_dtype``), e.g. ``compressed-tensors kv_cache_scheme``."""
    auto_kv_cache_dtype: str | None = None
    """What ``--kv-cache-dtype auto`` gives with this checkpoint (None: the
    model dtype): fixes must not offer ``auto`` as "bf16" where it is fp8."""

    @property
    def kv_from_checkpoint(self) -> bool:
        """The main cache dtype is the one the checkpoint declares: the flag
        is ``auto`` and vLLM gives ``auto`` the declared dtype."""
        return (
            self.kv_cache_source is not None
            and self.kv_cache_flag == "auto"
            and self.kv_cache_dtype == self.auto_kv_cache_dtype
        )

    def resolve_kv_cache_dtype(self, flag: str) -> str:
        """The dtype a ``--kv-cache-dtype`` value gives with this checkpoint."""
        return (self.auto_kv_cache_dtype or flag) if flag == "auto" else flag

    def _precision(self, kv_cache_dtype: str) -> str:
        if kv_cache_dtype == "auto":
            return self.model_dtype
        if kv_cache_dtype in FP8_E4M3_KV_CACHE_DTYPES:
            return "fp8_e4m3"
        return kv_cache_dtype

    @property
    def main_cache_precision(self) -> str:
        """The main cache's precision: ``auto`` resolved to the model dtype."""
        return self._precision(self.kv_cache_dtype)

    @property
    def main_is_quantized(self) -> bool:
        """The main cache stores something other than the model dtype, so a
        layer vLLM skips from quantization stores another precision."""
        return self.main_cache_precision != self.model_dtype

    @property
    def unquantized_dense_layers(self) -> tuple[int, ...]:
        """Dense layers whose main cache differs from the rest of the pool."""
        return self.layers.skipped_dense if self.main_is_quantized else ()

    @property
    def draft_cache_precision(self) -> str:
        """The drafter's main cache precision (the target's unless set)."""
        return self._precision(self.draft_kv_cache_dtype or self.kv_cache_dtype)


class Outcome(enum.Enum):
    UNCHANGED = "unchanged"
    """Both caches bf16: vLLM's behaviour, untouched."""
    INHERITED = "inherited"
    """``auto`` indexer resolved to fp8 from the fp8 KV cache."""
    UNIFORM = "uniform"
    """Both sides already fp8 e4m3 as the user set them."""
    MIXED = "mixed"
    """Two precisions, accepted by the operator's explicit opt-in; every
    worker and the scheduler zero new blocks."""
    ERROR = "error"


# How a rendered fix line's comment lists what no flag sets.
FIX_NOTE_SEPARATOR = "; "
FIX_REMOVES = "remove "
FIX_NEEDS = "needs "

AITER_REQUIREMENT = "a ROCm vLLM image or build that ships aiter"
AITER_MSA_REQUIREMENT = (
    "an aiter with the MSA kernels (aiter.ops.msa_block_select, "
    "aiter.ops.msa_attention), as in the ROCm vLLM 0.33 image"
)


@dataclass(frozen=True)
class Fix:
    """One way out: what to install, then flags and variables to paste."""

    summary: str
    flags: tuple[tuple[str, str], ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    requires: tuple[str, ...] = ()
    """Software no flag can stand in for (e.g. :data:`AITER_REQUIREMENT`)."""
    without: tuple[str, ...] = ()
    """Flags to remove from the command (a list flag cannot be set empty)."""

    def render(self) -> str:
        """One line that pastes into a shell: the variables and flags, then
        what they do (and what else to change) after ``#``."""
        words = [f"{k}={shlex.quote(v)}" for k, v in self.env]
        words += [f"{flag} {shlex.quote(value)}" for flag, value in self.flags]
        notes = [self.summary]
        notes += [f"{FIX_REMOVES}{flag} from the command" for flag in self.without]
        notes += [f"{FIX_NEEDS}{requirement}" for requirement in self.requires]
        comment = f"# {FIX_NOTE_SEPARATOR.join(notes)}"
        return f"{' '.join(words)}  {comment}" if words else comment

    @property
    def env_map(self) -> Mapping[str, str]:
        return dict(self.env)


@dataclass(frozen=True)
class Verdict:
    outcome: Outcome
    indexer_kv_dtype: str
    """The value vLLM should run with; equal to the request unless inherited."""
    reason: str
    fixes: tuple[Fix, ...] = ()
    notes: tuple[str, ...] = ()
    """Warnings that do not stop the start (e.g. a skip request vLLM ignores)."""
    fp8_indexer: str | None = None
    """Which indexer runs the fp8 index cache, where the platform has more
    than one (``ROCM_TRITON_INDEXER`` or ``ROCM_MSA_INDEXER``)."""

    @property
    def uniform(self) -> bool:
        return self.outcome in (Outcome.INHERITED, Outcome.UNIFORM)

    @property
    def starts(self) -> bool:
        return self.outcome is not Outcome.ERROR

    @property
    def message(self) -> str:
        if not self.fixes:
            return self.reason
        lines = [self.reason, "Fix with one of:"]
        lines += [f"  {fix.render()}" for fix in self.fixes]
        return "\n".join(lines)


@dataclass(frozen=True)
class _Blocker:
    """Why no fp8 indexer impl would be selected here, and what changes that."""

    reason: str
    fixes: tuple[Fix, ...]


def _enable_aiter_fix(platform: PlatformFacts) -> Fix:
    # Only what is not already set: never tell a user to set what they set.
    wanted = (
        (AITER_ENV, platform.aiter_enabled),
        (SHUFFLE_KV_ENV, platform.shuffle_kv_cache_layout),
    )
    return Fix(
        "turn on AITER sparse paged attention and its MSA indexer",
        env=tuple((name, "1") for name, already in wanted if not already),
    )


def _indexer_cp_needs_rocm_tp(facts: PrecisionFacts) -> _Blocker | None:
    # select_indexer_impl_cls / msa_indexer_cp_enabled: both CP indexers are
    # ROCm kernels that shard the index cache across TP ranks.
    platform = facts.platform
    if not facts.indexer_cp or (
        platform.vendor == "rocm" and facts.tensor_parallel_size > 1
    ):
        return None
    where = (
        f"tensor_parallel_size={facts.tensor_parallel_size}"
        if platform.vendor == "rocm"
        else platform.name
    )
    return _Blocker(
        "minimax_m3_indexer_cp shards the indexer across ROCm TP ranks and "
        f"cannot run on {where}",
        (Fix("use the default indexer", flags=((INDEXER_CP_FLAG, "false"),)),),
    )


def _rocm_msa_needs_gfx950(facts: PrecisionFacts) -> _Blocker | None:
    # msa_indexer_unsupported_reason checks AITER first; the arch goes first
    # here so gfx942 hears the reason no env variable can change.
    platform = facts.platform
    if platform.vendor != "rocm" or platform.rocm_gfx950:
        return None
    return _Blocker(
        "the AITER MSA indexer's fp8 MFMA kernels exist only on gfx950 "
        f"(MI355X/MI350X), and this is {platform.name}",
        (),
    )


def _rocm_msa_needs_aiter_installed(facts: PrecisionFacts) -> _Blocker | None:
    # vLLM's AITER switches (@if_aiter_supported) all answer None without it.
    platform = facts.platform
    if platform.vendor != "rocm" or platform.aiter_installed:
        return None
    return _Blocker(
        "the AITER MSA indexer needs the aiter package, which is not installed "
        "(or does not support this GPU)",
        (Fix("install aiter", requires=(AITER_REQUIREMENT,)),),
    )


def _rocm_msa_needs_aiter_msa_kernels(facts: PrecisionFacts) -> _Blocker | None:
    # The MSA indexer imports them in its CP gate (model build, TP > 1) and
    # in its kernel launches: without them a model builds, then fails a request.
    platform = facts.platform
    if (
        platform.vendor != "rocm"
        or not platform.aiter_installed
        or platform.aiter_msa_kernels
    ):
        return None
    return _Blocker(
        "the installed aiter lacks the MSA kernels the AITER MSA indexer imports "
        "(aiter.ops.msa_block_select, aiter.ops.msa_attention)",
        (Fix("update aiter", requires=(AITER_MSA_REQUIREMENT,)),),
    )


def _rocm_msa_needs_aiter_sparse_pa(facts: PrecisionFacts) -> _Blocker | None:
    platform = facts.platform
    if platform.vendor != "rocm" or (
        platform.aiter_enabled and platform.shuffle_kv_cache_layout
    ):
        return None
    state = ", ".join(
        f"{name} unset" if name in platform.unset_env else f"{name}={int(value)}"
        for name, value in (
            (AITER_ENV, platform.aiter_enabled),
            (SHUFFLE_KV_ENV, platform.shuffle_kv_cache_layout),
        )
    )
    return _Blocker(
        f"the AITER MSA indexer runs only with AITER sparse paged attention ({state})",
        (_enable_aiter_fix(platform),),
    )


def _rocm_msa_shape_contract(facts: PrecisionFacts) -> _Blocker | None:
    if facts.platform.vendor != "rocm":
        return None
    shape = facts.shape
    contract = (
        ("score_type", shape.score_type, MSA_SCORE_TYPE),
        ("topk_blocks", shape.topk_blocks, MSA_TOPK_BLOCKS),
        ("sparse_block_size", shape.sparse_block_size, MSA_SPARSE_BLOCK_SIZE),
        ("index_head_dim", shape.index_head_dim, MSA_INDEX_HEAD_DIM),
    )
    for name, got, needed in contract:
        if got != needed:
            return _Blocker(
                f"the AITER MSA indexer needs {name}={needed!r}, and this "
                f"checkpoint has {name}={got!r}",
                (),
            )
    return None


def _rocm_msa_topk_block_limit(facts: PrecisionFacts) -> _Blocker | None:
    if facts.platform.vendor != "rocm":
        return None
    block = facts.shape.sparse_block_size
    blocks = math.ceil(facts.max_model_len / block)
    if blocks <= MSA_MAX_BLOCKS_PER_ROW:
        return None
    return _Blocker(
        f"max_model_len={facts.max_model_len} spans {blocks} blocks, more "
        f"than the {MSA_MAX_BLOCKS_PER_ROW} the AITER MSA top-k holds",
        (
            Fix(
                "fit the AITER MSA top-k",
                flags=((MAX_MODEL_LEN_FLAG, str(MSA_MAX_BLOCKS_PER_ROW * block)),),
            ),
        ),
    )


def _needs_fp8_capable_gpu(facts: PrecisionFacts) -> _Blocker | None:
    # select_indexer_impl_cls: fp8 needs a CUDA device that supports fp8 (SM89
    # and newer) or, with this plugin, ROCm (its own rules below).
    platform = facts.platform
    if platform.vendor == "rocm" or (
        platform.vendor == "cuda" and platform.cuda_supports_fp8
    ):
        return None
    return _Blocker(
        "the fp8 indexer needs a CUDA GPU with fp8 support (or ROCm gfx942 or "
        f"gfx950), and {platform.name} is neither",
        (),
    )


def _rocm_triton_fp8_needs_gfx942_or_gfx950(
    facts: PrecisionFacts,
) -> _Blocker | None:
    # The plugin opens vLLM's Triton indexer to fp8 where Triton's fp8 dots
    # are native and its writer is right: gfx950 (e4m3fn, vLLM's fused insert)
    # and gfx942 (e4m3fnuz, the plugin's writer).
    platform = facts.platform
    if platform.vendor != "rocm" or platform.rocm_gfx950 or platform.rocm_gfx942:
        return None
    return _Blocker(
        f"{ROCM_TRITON_INDEXER} runs an fp8 index cache only on gfx950 "
        f"(MI355X/MI350X) and gfx942 (MI300X/MI325X), and this is {platform.name}",
        (),
    )


def _rocm_triton_fp8_needs_no_indexer_cp(facts: PrecisionFacts) -> _Blocker | None:
    # select_indexer_impl_cls: the context-parallel Triton indexer takes only
    # a bf16 index cache.
    if facts.platform.vendor != "rocm" or not facts.indexer_cp:
        return None
    return _Blocker(
        f"{ROCM_TRITON_INDEXER} shards its index cache across TP ranks "
        "(minimax_m3_indexer_cp) only in bf16",
        (Fix("use the default indexer", flags=((INDEXER_CP_FLAG, "false"),)),),
    )


def _rocm_triton_indexer_needs_one_kv_head_per_rank(
    facts: PrecisionFacts,
) -> _Blocker | None:
    # minimax_m3_use_aiter_sparse_pa: AITER sparse PA serves more than one KV
    # head per rank only with the MSA indexer's page table; beside the Triton
    # indexer the model build fails whatever the index cache dtype.
    if not facts.platform.aiter_sparse_pa or facts.kv_heads_per_rank <= 1:
        return None
    return _Blocker(
        f"beside AITER sparse paged attention {ROCM_TRITON_INDEXER} serves "
        f"one KV head per rank, and tensor_parallel_size="
        f"{facts.tensor_parallel_size} leaves {facts.kv_heads_per_rank}",
        (
            Fix(
                f"{ROCM_TRITON_INDEXER} without AITER sparse paged attention",
                env=((SHUFFLE_KV_ENV, "0"),),
            ),
        ),
    )


ANY_INDEXER = ""
"""A rule every fp8 indexer on the platform needs."""
ROCM_MSA_INDEXER = "the AITER MSA indexer"
ROCM_TRITON_INDEXER = "vLLM's Triton indexer"
"""On ROCm, with an fp8 index cache, only by this plugin's registry entry
``minimax_m3_rocm_fp8_triton_indexer`` (``patches.py``)."""


@dataclass(frozen=True)
class Rule:
    """One condition an fp8 MiniMax-M3 indexer needs, restating a vLLM gate."""

    name: str
    check: Callable[[PrecisionFacts], _Blocker | None]
    indexer: str = ANY_INDEXER
    """The indexer this rule gates (``ANY_INDEXER``: all of them)."""
    once_selected: bool = False
    """Checked only once vLLM has selected the indexer: failing it then stops
    the start instead of letting vLLM fall back to another indexer."""


FP8_INDEXER_RULES: tuple[Rule, ...] = (
    Rule("indexer_cp_needs_rocm_tp", _indexer_cp_needs_rocm_tp),
    Rule("needs_fp8_capable_gpu", _needs_fp8_capable_gpu),
    # ROCm: vLLM selects the AITER MSA indexer wherever its contract holds
    # (amd/model.py, _build_sparse_indexer_context), else the neutral one.
    Rule("rocm_msa_needs_gfx950", _rocm_msa_needs_gfx950, ROCM_MSA_INDEXER),
    Rule(
        "rocm_msa_needs_aiter_installed",
        _rocm_msa_needs_aiter_installed,
        ROCM_MSA_INDEXER,
    ),
    Rule(
        "rocm_msa_needs_aiter_sparse_pa",
        _rocm_msa_needs_aiter_sparse_pa,
        ROCM_MSA_INDEXER,
    ),
    Rule("rocm_msa_shape_contract", _rocm_msa_shape_contract, ROCM_MSA_INDEXER),
    Rule("rocm_msa_topk_block_limit", _rocm_msa_topk_block_limit, ROCM_MSA_INDEXER),
    Rule(
        "rocm_msa_needs_aiter_msa_kernels",
        _rocm_msa_needs_aiter_msa_kernels,
        ROCM_MSA_INDEXER,
        once_selected=True,
    ),
    Rule(
        "rocm_triton_fp8_needs_gfx942_or_gfx950",
        _rocm_triton_fp8_needs_gfx942_or_gfx950,
        ROCM_TRITON_INDEXER,
    ),
    Rule(
        "rocm_triton_fp8_needs_no_indexer_cp",
        _rocm_triton_fp8_needs_no_indexer_cp,
        ROCM_TRITON_INDEXER,
    ),
    Rule(
        "rocm_triton_indexer_needs_one_kv_head_per_rank",
        _rocm_triton_indexer_needs_one_kv_head_per_rank,
        ROCM_TRITON_INDEXER,
    ),
)
"""Every condition, per indexer; :func:`fp8_indexers` says which one runs."""


@dataclass(frozen=True)
class Fp8Indexers:
    """Which fp8 indexer vLLM would select here, or what stops each one."""

    runs: str | None
    """The indexer that runs an fp8 index cache (``ANY_INDEXER`` off ROCm,
    where vLLM's own choice needs no name); None when none can."""
    common: tuple[_Blocker, ...] = ()
    """What stops every indexer."""
    candidates: tuple[tuple[str, tuple[_Blocker, ...]], ...] = ()
    """Each indexer that could be made to run, with what stops it alone."""

    @property
    def blocked(self) -> bool:
        return self.runs is None

    @property
    def reasons(self) -> tuple[str, ...]:
        """Why none runs: for an indexer that hardware or the checkpoint rules
        out, only that (what a flag could change would not help it)."""
        own = []
        for _, blockers in self.candidates:
            final = [b for b in blockers if not b.fixes]
            own += [b.reason for b in final or blockers]
        return tuple(dict.fromkeys([*(b.reason for b in self.common), *own]))


NO_FP8_INDEXER_QUESTION = Fp8Indexers(runs=ANY_INDEXER)
"""For pools whose index cache needs no fp8 indexer (both caches bf16)."""


def fp8_indexers(facts: PrecisionFacts) -> Fp8Indexers:
    """Which fp8 indexer would run with these facts, as vLLM selects it."""

    def failing(indexer: str, once_selected: bool = False) -> tuple[_Blocker, ...]:
        return tuple(
            blocker
            for rule in FP8_INDEXER_RULES
            if rule.indexer == indexer and rule.once_selected == once_selected
            if (blocker := rule.check(facts)) is not None
        )

    common = failing(ANY_INDEXER)
    if facts.platform.vendor != "rocm":
        return Fp8Indexers(
            runs=None if common else ANY_INDEXER,
            common=common,
            candidates=((ANY_INDEXER, ()),) if common else (),
        )
    msa = failing(ROCM_MSA_INDEXER)
    msa_after = failing(ROCM_MSA_INDEXER, once_selected=True)
    if not common and not msa:
        # Selected: vLLM builds it and fails there, with no fallback.
        if msa_after:
            return Fp8Indexers(None, (), ((ROCM_MSA_INDEXER, msa_after),))
        return Fp8Indexers(ROCM_MSA_INDEXER)
    triton = failing(ROCM_TRITON_INDEXER)
    if not common and not triton:
        return Fp8Indexers(ROCM_TRITON_INDEXER)
    return Fp8Indexers(
        None,
        common,
        ((ROCM_TRITON_INDEXER, triton), (ROCM_MSA_INDEXER, msa + msa_after)),
    )


def _kv_origin(facts: PrecisionFacts, in_full: bool = False) -> str:
    """Where the main cache dtype came from: a few words, or ``in_full``."""
    if not facts.kv_from_checkpoint:
        return f"{KV_CACHE_DTYPE_FLAG} {facts.kv_cache_dtype}"
    if not in_full:
        return f"the checkpoint's {facts.kv_cache_dtype} KV cache"
    article = "an" if facts.kv_cache_dtype.startswith("fp8") else "a"
    return (
        f"the checkpoint's quantization config declares {article} "
        f"{facts.kv_cache_dtype} KV cache ({facts.kv_cache_source}), which vLLM "
        f"applies to {KV_CACHE_DTYPE_FLAG} auto"
    )


def _describe(facts: PrecisionFacts) -> str:
    return (
        f"{_kv_origin(facts)}, with indexer_kv_dtype="
        f"{facts.indexer_kv_dtype!r} on {facts.platform.name}"
    )


MIXED_POOL_HAZARD = (
    "vLLM 0.33 calls such a pool mixed: every worker builds a KV block zeroer "
    "its scheduler never asks to run, so reused blocks reach the attention "
    "kernels as they were (docs/mixed-pools.md)."
)
"""Said once, on its own line, by every refusal whose pool would be mixed."""


def _why(indexers: Fp8Indexers) -> str:
    return "; and ".join(indexers.reasons)


_FIRST_LINE_ROOM = 150
"""Characters a refusal's first line leaves for what was asked and what
cannot run (it stays under about 200 with the prefix and a dtype name)."""

_OPT_IN_NEEDS = f"{ALLOW_MIXED_ENV}=1 keeps the bf16 indexer, which needs "


def _with_line(reason: str, line: str, mixed_pool: bool = False) -> str:
    """``reason`` with ``line`` added after its causes, and the mixed-pool
    hazard last, once, where ``mixed_pool`` (or the reason already has it)."""
    lines = [part for part in reason.split("\n") if part != MIXED_POOL_HAZARD]
    # What the opt-in would need stays last, after the hazard it accepts.
    opt_in = [part for part in lines if part.startswith(_OPT_IN_NEEDS)]
    lines = [part for part in lines if part not in opt_in] + [line]
    if mixed_pool or MIXED_POOL_HAZARD in reason:
        lines.append(MIXED_POOL_HAZARD)
    return "\n".join(lines + opt_in)


def _fp8_fixes(
    facts: PrecisionFacts, indexers: Fp8Indexers, *flags: tuple[str, str]
) -> tuple[Fix, ...]:
    """The fixes that give both caches fp8 e4m3, one per indexer this machine
    can be made to run (none where hardware or checkpoint stops them all)."""
    keeps_main = facts.kv_cache_dtype in FP8_E4M3_KV_CACHE_DTYPES and not any(
        flag == KV_CACHE_DTYPE_FLAG for flag, _ in flags
    )
    summary = (
        "keep the fp8 KV cache, fp8 indexer"
        if keeps_main
        else "fp8 KV cache and fp8 indexer"
    )
    # Where an indexer already runs, the flags alone are the fix.
    candidates = indexers.candidates or ((indexers.runs or ANY_INDEXER, ()),)
    fixable = [
        (name, indexers.common + blockers)
        for name, blockers in candidates
        if all(blocker.fixes for blocker in indexers.common + blockers)
    ]
    fixes = []
    for name, blockers in fixable:
        enabling = [blocker.fixes[0] for blocker in blockers]
        fixes.append(
            Fix(
                f"{summary} ({name})" if name and len(fixable) > 1 else summary,
                flags=tuple(flags) + tuple(f for fix in enabling for f in fix.flags),
                env=tuple(dict(e for fix in enabling for e in fix.env).items()),
                requires=tuple(
                    dict.fromkeys(r for fix in enabling for r in fix.requires)
                ),
            )
        )
    return tuple(fixes)


def _bf16_indexer_needs(
    facts: PrecisionFacts,
) -> tuple[tuple[tuple[str, str], ...], tuple[tuple[str, str], ...]]:
    """Flags and env the bf16 indexer needs to start in this config."""
    flags: tuple[tuple[str, str], ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    cp = _indexer_cp_needs_rocm_tp(facts)
    if cp is not None:
        flags += cp.fixes[0].flags
    if facts.platform.aiter_sparse_pa and facts.kv_heads_per_rank > 1:
        # minimax_m3_use_aiter_sparse_pa: with more than one KV head per rank
        # AITER sparse PA needs the fp8 (MSA) indexer; bf16 runs without it.
        env = ((SHUFFLE_KV_ENV, "0"),)
    return flags, env


def _bf16_fix(facts: PrecisionFacts, summary: str, *flags: tuple[str, str]) -> Fix:
    """A bf16-indexer fallback, with what else it needs on this machine."""
    more_flags, env = _bf16_indexer_needs(facts)
    return Fix(summary, flags=flags + more_flags, env=env)


def _bf16_main_flags(facts: PrecisionFacts) -> tuple[tuple[str, str], ...]:
    # "auto" stores the model dtype, and vLLM refuses a float KV dtype other
    # than the model's: a non-bf16 model must itself run bf16. Where the
    # checkpoint declares a KV cache, "auto" is that one: an explicit bfloat16
    # is what turns it off (vLLM applies a declared cache only to "auto").
    main = (
        (KV_CACHE_DTYPE_FLAG, "auto" if facts.auto_kv_cache_dtype is None else BF16),
    )
    return main if facts.model_dtype == BF16 else ((DTYPE_FLAG, BF16), *main)


def _both_bf16_fix(facts: PrecisionFacts) -> Fix:
    return _bf16_fix(
        facts,
        "both caches bf16, stock vLLM",
        *_bf16_main_flags(facts),
        (INDEXER_KV_DTYPE_FLAG, "auto"),
    )


def _main_cache_runs_here(facts: PrecisionFacts) -> bool:
    """Whether vLLM would run this main cache at all (beside a bf16 indexer)."""
    kv, platform = facts.kv_cache_dtype, facts.platform
    if kv in ("float16", BF16):
        # VllmConfig._reject_mismatched_float_kv_cache: an explicit float KV
        # cache must equal the model dtype.
        return kv == facts.model_dtype
    # TritonAttentionImpl: an fp8 KV cache needs native fp8 (SM89+) on CUDA.
    return not (
        kv.startswith("fp8")
        and platform.vendor == "cuda"
        and not platform.cuda_supports_fp8
    )


def _mixed_fix(facts: PrecisionFacts, bf16_indexer: bool = True) -> Fix | None:
    """The explicit opt-in: keep this main cache beside another precision
    (a bf16 indexer, or layers skipped from quantization)."""
    if not _main_cache_runs_here(facts):
        return None
    flags, env = (
        _bf16_indexer_needs(facts)
        if facts.layers.has_index_cache and bf16_indexer
        else ((), ())
    )
    return Fix(
        "accept a mixed pool: every worker zeroes new blocks",
        flags=flags,
        env=((ALLOW_MIXED_ENV, "1"), *env),
    )


def _error(
    facts: PrecisionFacts,
    what: str,
    *fixes: Fix | None,
    because: str = "",
    mixed_pool: bool = False,
) -> Verdict:
    """A refusal: first what was asked, where, and what cannot run (one short
    line), then why, then the mixed-pool hazard where the pool would be mixed."""
    reason = f"MiniMax-M3 KV precision: {_describe(facts)}: {what}."
    if facts.kv_from_checkpoint:
        # The first line names it briefly; here where it came from.
        origin = _kv_origin(facts, in_full=True)
        reason = _with_line(reason, f"{origin[0].upper()}{origin[1:]}.")
    if because:
        reason = _with_line(reason, f"Because {because}.")
    if mixed_pool:
        reason = _with_line(reason, MIXED_POOL_HAZARD)
    return Verdict(
        Outcome.ERROR,
        facts.indexer_kv_dtype,
        reason,
        tuple(fix for fix in fixes if fix is not None),
    )


def _is_fp8_indexer(facts: PrecisionFacts) -> bool:
    return facts.indexer_kv_dtype in FP8_INDEXER_DTYPES


def _fp8_indexer_must_run_here(
    facts: PrecisionFacts, indexers: Fp8Indexers
) -> Verdict | None:
    if not _is_fp8_indexer(facts) or not indexers.blocked:
        return None
    return _error(
        facts,
        "no fp8 indexer can run here",
        *_fp8_fixes(facts, indexers, (KV_CACHE_DTYPE_FLAG, "fp8")),
        _both_bf16_fix(facts),
        because=_why(indexers),
    )


def _fp8_indexer_needs_e4m3_main(
    facts: PrecisionFacts, indexers: Fp8Indexers
) -> Verdict | None:
    kv = facts.kv_cache_dtype
    if not _is_fp8_indexer(facts) or kv in FP8_E4M3_KV_CACHE_DTYPES:
        return None
    return _error(
        facts,
        f"the indexer cache would be fp8 e4m3 and the main cache "
        f"{facts.main_cache_precision}",
        Fix("both caches fp8 e4m3", flags=((KV_CACHE_DTYPE_FLAG, "fp8"),)),
        _both_bf16_fix(facts),
        mixed_pool=True,
    )


def _indexer_stores_bf16_or_fp8(
    facts: PrecisionFacts, indexers: Fp8Indexers
) -> Verdict | None:
    # MiniMaxM3IndexerCache raises NotImplementedError at model build for
    # anything else (mxfp4, nvfp4): no main cache can match it.
    indexer = facts.indexer_kv_dtype
    if indexer in BF16_INDEXER_DTYPES or _is_fp8_indexer(facts):
        return None
    keep_fp8: tuple[Fix, ...] = ()
    if facts.kv_cache_dtype in FP8_E4M3_KV_CACHE_DTYPES:
        keep_fp8 = _fp8_fixes(facts, indexers, (INDEXER_KV_DTYPE_FLAG, "fp8"))
    return _error(
        facts,
        f"the MiniMax-M3 indexer cache stores only bf16 or fp8 e4m3, not {indexer}",
        *keep_fp8,
        _both_bf16_fix(facts),
    )


def _main_cache_matches_an_indexer(
    facts: PrecisionFacts, indexers: Fp8Indexers
) -> Verdict | None:
    main = facts.main_cache_precision
    if main in (BF16, "fp8_e4m3"):
        return None
    return _error(
        facts,
        f"the main cache would be {main} and the indexer cache bf16",
        *_fp8_fixes(
            facts,
            indexers,
            (KV_CACHE_DTYPE_FLAG, "fp8"),
            (INDEXER_KV_DTYPE_FLAG, "fp8"),
        ),
        _both_bf16_fix(facts),
        _mixed_fix(facts),
        because="MiniMax-M3 indexers store only bf16 or fp8 e4m3, so no indexer "
        "shares this precision",
        mixed_pool=True,
    )


def _auto_indexer_needs_an_fp8_indexer(
    facts: PrecisionFacts, indexers: Fp8Indexers
) -> Verdict | None:
    if facts.indexer_kv_dtype != "auto" or not indexers.blocked:
        return None
    return _error(
        facts,
        "the indexer would stay bf16 beside the fp8 main cache",
        *_fp8_fixes(facts, indexers),
        _bf16_fix(facts, "main cache bf16", *_bf16_main_flags(facts)),
        _mixed_fix(facts),
        because=_why(indexers),
        mixed_pool=True,
    )


def _explicit_indexer_matches_fp8_main(
    facts: PrecisionFacts, indexers: Fp8Indexers
) -> Verdict | None:
    indexer = facts.indexer_kv_dtype
    if indexer == "auto" or _is_fp8_indexer(facts):
        return None
    return _error(
        facts,
        f"an explicit {indexer} indexer would sit beside the fp8 main cache",
        *_fp8_fixes(facts, indexers, (INDEXER_KV_DTYPE_FLAG, "fp8")),
        _both_bf16_fix(facts),
        _mixed_fix(facts),
        mixed_pool=True,
    )


def _skipped_layers(facts: PrecisionFacts) -> str | None:
    layers = facts.unquantized_dense_layers
    if not layers:
        return None
    return (
        f"{SKIP_LAYERS_FLAG} keeps {facts.layers.describe(layers)} at "
        f"{facts.model_dtype} beside {facts.main_cache_precision} main caches "
        "elsewhere"
    )


def _skipped_layers_keep_one_precision(
    facts: PrecisionFacts, indexers: Fp8Indexers
) -> Verdict | None:
    # vLLM's generic Attention (MiniMax-M3's dense layers) stores a skipped
    # layer's main cache at the model dtype; the rest of the pool is quantized.
    why = _skipped_layers(facts)
    if why is None:
        return None
    keep = (
        "keep every layer's main cache fp8"
        if facts.main_cache_precision == "fp8_e4m3"
        else f"keep every layer's main cache {facts.main_cache_precision}"
    )
    layers = facts.unquantized_dense_layers
    named = facts.layers.describe(layers)
    because = "vLLM's Attention stores a skipped dense layer's main cache at the "
    because += "model dtype"
    what = f"{SKIP_LAYERS_FLAG} keeps {named} at {facts.model_dtype} beside "
    if len(f"{_describe(facts)}: {what}") > _FIRST_LINE_ROOM:  # many layers
        what = f"{SKIP_LAYERS_FLAG} keeps {len(layers)} layers at "
        what += f"{facts.model_dtype} beside "
        because = f"it names {named}, and {because}"
    return _error(
        facts,
        what + facts.main_cache_precision,
        # vLLM itself must run this main cache (no fp8 KV cache below SM89).
        Fix(keep, without=(SKIP_LAYERS_FLAG,))
        if _main_cache_runs_here(facts)
        else None,
        _both_bf16_fix(facts),
        # Every indexer rule passed: the index cache runs as it would uniform.
        _mixed_fix(
            facts,
            bf16_indexer=_uniform_indexer(facts).indexer_kv_dtype
            not in FP8_INDEXER_DTYPES,
        ),
        because=because,
        mixed_pool=True,
    )


def _drafter_mismatch(facts: PrecisionFacts) -> str | None:
    # The proposer builds the drafter with speculative_config.kv_cache_dtype;
    # its layers share the target's block pool (and its indexer dtype).
    draft = facts.draft_kv_cache_dtype
    if draft is None or facts.draft_cache_precision == facts.main_cache_precision:
        return None
    return (
        f"the MTP drafter would cache {facts.draft_cache_precision} "
        f"beside the target's {facts.main_cache_precision}"
    )


def _drafter_kv_cache_matches_target(
    facts: PrecisionFacts, indexers: Fp8Indexers
) -> Verdict | None:
    why = _drafter_mismatch(facts)
    if why is None:
        return None
    return _error(
        facts,
        why,
        Fix(
            "the drafter shares the target's KV dtype (with a JSON "
            f'--speculative-config, put "kv_cache_dtype": "{facts.kv_cache_dtype}" '
            "in it instead: a dotted flag after the JSON replaces it)",
            flags=((DRAFT_KV_CACHE_DTYPE_FLAG, facts.kv_cache_dtype),),
        ),
        because=f"speculative_config.kv_cache_dtype={facts.draft_kv_cache_dtype} "
        "is the drafter's own, and its layers share the target's block pool",
        mixed_pool=True,
    )


@dataclass(frozen=True)
class PairingRule:
    """One way the pool's precisions can fail to match, and its fixes."""

    name: str
    check: Callable[[PrecisionFacts, list[_Blocker]], Verdict | None]
    mixed_pool_runs: bool = False
    """The pool would be mixed but can run: the explicit opt-in accepts it."""
    about_index_cache: bool = True
    """Asks about the index cache: moot in a pool that has none."""


PAIRING_RULES: tuple[PairingRule, ...] = (
    PairingRule("fp8_indexer_must_run_here", _fp8_indexer_must_run_here),
    PairingRule("fp8_indexer_needs_e4m3_main", _fp8_indexer_needs_e4m3_main),
    PairingRule("indexer_stores_bf16_or_fp8", _indexer_stores_bf16_or_fp8),
    PairingRule(
        "main_cache_matches_an_indexer",
        _main_cache_matches_an_indexer,
        mixed_pool_runs=True,
    ),
    PairingRule(
        "auto_indexer_needs_an_fp8_indexer",
        _auto_indexer_needs_an_fp8_indexer,
        mixed_pool_runs=True,
    ),
    PairingRule(
        "explicit_indexer_matches_fp8_main",
        _explicit_indexer_matches_fp8_main,
        mixed_pool_runs=True,
    ),
    PairingRule(
        "skipped_layers_keep_one_precision",
        _skipped_layers_keep_one_precision,
        mixed_pool_runs=True,
        about_index_cache=False,
    ),
)
"""Checked in order; the first that objects decides."""

DRAFTER_RULES: tuple[PairingRule, ...] = (
    PairingRule("drafter_kv_cache_matches_target", _drafter_kv_cache_matches_target),
)
"""Checked once the target's own pool is judged: the drafter's layers join it."""


@dataclass(frozen=True)
class ScopeRule:
    """When the index-cache rules apply at all."""

    name: str
    applies: Callable[[PrecisionFacts], bool]


SCOPE_RULES: tuple[ScopeRule, ...] = (
    # vLLM builds an index cache only for layers sparse_attention_freq marks
    # (and the MTP drafter's): a pool without one has no indexer question.
    ScopeRule("pool_has_an_index_cache", lambda facts: facts.layers.has_index_cache),
)


def _with_drafter_matched(facts: PrecisionFacts, verdict: Verdict) -> Verdict:
    """The target's refusal, each fix also giving the drafter the target's dtype."""
    if facts.draft_kv_cache_dtype is None:
        return verdict

    def matched(fix: Fix) -> Fix:
        # A fix that changes the target's KV dtype must move the drafter too
        # (to what the target then stores: the drafter's "auto" is the model
        # dtype, whatever the checkpoint declares).
        fixed = fixed_facts(facts, fix)
        if _drafter_mismatch(fixed) is None:
            return fix
        kv = fixed.kv_cache_dtype
        return replace(fix, flags=(*fix.flags, (DRAFT_KV_CACHE_DTYPE_FLAG, kv)))

    why = _drafter_mismatch(facts)
    reason = (
        verdict.reason
        if why is None
        else _with_line(verdict.reason, f"Also, {why}.", mixed_pool=True)
    )
    return replace(
        verdict, reason=reason, fixes=tuple(matched(fix) for fix in verdict.fixes)
    )


def fixed_facts(facts: PrecisionFacts, fix: Fix) -> PrecisionFacts:
    """The facts once ``fix`` is applied (its KV and model dtypes, its skips)."""
    flags = dict(fix.flags)
    layers = facts.layers
    if SKIP_LAYERS_FLAG in fix.without:
        layers = replace(layers, skip_requested=frozenset())
    if KV_CACHE_DTYPE_FLAG not in flags:
        return replace(
            facts, model_dtype=flags.get(DTYPE_FLAG, facts.model_dtype), layers=layers
        )
    flag = flags[KV_CACHE_DTYPE_FLAG]
    kv = facts.resolve_kv_cache_dtype(flag)
    return replace(
        facts,
        kv_cache_dtype=kv,
        kv_cache_flag=flag,
        model_dtype=flags.get(DTYPE_FLAG, facts.model_dtype),
        layers=layers,
    )


def facts_with_fix(facts: PrecisionFacts, fix: Fix) -> PrecisionFacts:
    """The facts of the command once ``fix`` is applied whole: its flags (KV,
    model, indexer and drafter dtypes, indexer CP, context length, skips)
    and its variables (AITER's two and the mixed-pool opt-in)."""
    fixed = fixed_facts(facts, fix)
    flags, env = dict(fix.flags), fix.env_map
    platform = fixed.platform
    if AITER_ENV in env:
        platform = replace(platform, aiter_enabled=env[AITER_ENV] == "1")
    if SHUFFLE_KV_ENV in env:
        platform = replace(platform, shuffle_kv_cache_layout=env[SHUFFLE_KV_ENV] == "1")
    return replace(
        fixed,
        platform=platform,
        indexer_kv_dtype=flags.get(INDEXER_KV_DTYPE_FLAG, fixed.indexer_kv_dtype),
        indexer_cp=flags.get(INDEXER_CP_FLAG, str(fixed.indexer_cp)).lower() == "true",
        max_model_len=int(flags.get(MAX_MODEL_LEN_FLAG, fixed.max_model_len)),
        draft_kv_cache_dtype=flags.get(
            DRAFT_KV_CACHE_DTYPE_FLAG, fixed.draft_kv_cache_dtype
        ),
        allow_mixed=env.get(ALLOW_MIXED_ENV, "1" if fixed.allow_mixed else "0") == "1",
    )


def _with_skipped_layers_dropped(facts: PrecisionFacts, verdict: Verdict) -> Verdict:
    """A refusal whose fixes would quantize the main cache also drops the skip
    list that would leave some layers unquantized beside it."""
    if verdict.outcome is not Outcome.ERROR or not facts.layers.skipped_dense:
        return verdict

    def dropped(fix: Fix) -> Fix:
        if ALLOW_MIXED_ENV in fix.env_map:
            return fix
        if not fixed_facts(facts, fix).unquantized_dense_layers:
            return fix
        return replace(fix, without=(*fix.without, SKIP_LAYERS_FLAG))

    reason = verdict.reason
    why = _skipped_layers(facts)
    if why is not None and SKIP_LAYERS_FLAG not in reason:
        reason = _with_line(reason, f"Also, {why}.", mixed_pool=True)
    return replace(verdict, reason=reason, fixes=tuple(map(dropped, verdict.fixes)))


def _ignored_skips(facts: PrecisionFacts) -> tuple[str, ...]:
    ignored = facts.layers.skip_ignored
    if not ignored or not facts.main_is_quantized:
        return ()
    stays = "its main cache stays" if len(ignored) == 1 else "their main caches stay"
    return (
        f"MiniMax-M3 sparse attention ignores {SKIP_LAYERS_FLAG} for "
        f"{facts.layers.describe(ignored)}: {stays} {facts.main_cache_precision}.",
    )


def _accept_mixed(facts: PrecisionFacts, refusal: Verdict, indexer: str) -> Verdict:
    """The opt-in's verdict: run mixed, unless the bf16 indexer cannot start."""
    flags, env = (
        _bf16_indexer_needs(facts)
        if facts.layers.has_index_cache and indexer not in FP8_INDEXER_DTYPES
        else ((), ())
    )
    if flags or env:
        blocked = _mixed_fix(facts)
        assert blocked is not None
        return replace(
            refusal,
            reason=refusal.reason
            + f"\n{_OPT_IN_NEEDS}"
            + " ".join([f"{k}={v}" for k, v in env] + [f"{f} {v}" for f, v in flags])
            + " here.",
            fixes=(blocked, *(f for f in refusal.fixes if f != blocked)),
        )
    main = facts.main_cache_precision
    parts = [f"main cache {main}"]
    if facts.unquantized_dense_layers:
        parts.append(
            f"{facts.layers.describe(facts.unquantized_dense_layers)} "
            f"{facts.model_dtype} ({SKIP_LAYERS_FLAG})"
        )
    if facts.layers.has_index_cache:
        parts.append(
            f"indexer cache {'fp8' if indexer in FP8_INDEXER_DTYPES else 'bf16'}"
        )
    cost = (
        ", and the bf16 index keys take twice the bytes of fp8 ones"
        if facts.layers.has_index_cache and indexer not in FP8_INDEXER_DTYPES
        else ""
    )
    return Verdict(
        Outcome.MIXED,
        indexer,
        f"mixed KV pool by {ALLOW_MIXED_ENV}=1: {', '.join(parts)} on "
        f"{facts.platform.name}. Every worker and the scheduler zero each newly "
        f"allocated block before use (one device memset per block){cost}",
    )


@functools.lru_cache(maxsize=256)
def decide(facts: PrecisionFacts) -> Verdict:
    """The indexer dtype MiniMax-M3 runs with, or the error that stops it.

    Never changes an explicit indexer dtype: only ``auto`` is resolved. A
    pure function of frozen facts, so remembered: every
    ``create_engine_config()`` of the same command asks it again. (Whoever
    changes the rule tables clears it: ``decide.cache_clear()``.)
    """
    target = _decide_target(replace(facts, draft_kv_cache_dtype=None))
    notes = _ignored_skips(facts)
    if target.outcome is Outcome.ERROR:
        verdict = _with_drafter_matched(facts, target)
        return replace(_with_skipped_layers_dropped(facts, verdict), notes=notes)
    for rule in DRAFTER_RULES:
        verdict = rule.check(facts, NO_FP8_INDEXER_QUESTION)
        if verdict is not None:
            return replace(_with_skipped_layers_dropped(facts, verdict), notes=notes)
    return replace(target, notes=notes)


def _uniform_indexer(facts: PrecisionFacts) -> Verdict:
    """What the index cache runs with once every pairing rule is satisfied."""
    indexer = facts.indexer_kv_dtype
    if not facts.layers.has_index_cache:
        return Verdict(
            Outcome.UNCHANGED,
            indexer,
            "no layer builds an index cache (sparse_attention_freq marks none)",
        )
    if facts.main_cache_precision == BF16 and indexer in BF16_INDEXER_DTYPES:
        return Verdict(Outcome.UNCHANGED, indexer, "both caches bf16")
    runs = fp8_indexers(facts).runs
    if _is_fp8_indexer(facts):
        return Verdict(
            Outcome.UNIFORM,
            indexer,
            "both caches fp8 e4m3 as set",
            fp8_indexer=runs or None,
        )
    if indexer == "auto":
        return Verdict(
            Outcome.INHERITED,
            "fp8",
            f"inherited from {_kv_origin(facts, in_full=True)}: "
            f"{runs or 'an fp8 indexer'} "
            f"runs on {facts.platform.name}, so both caches share fp8 e4m3 and "
            "vLLM builds no KV block zeroer",
            fp8_indexer=runs or None,
        )
    # Reached only if a pairing rule above is taken out: leave the request be.
    return Verdict(Outcome.UNCHANGED, indexer, "left as requested")


def _decide_target(facts: PrecisionFacts) -> Verdict:
    """The target model's own pool."""
    indexer = facts.indexer_kv_dtype
    in_scope = all(rule.applies(facts) for rule in SCOPE_RULES)
    both_bf16 = facts.main_cache_precision == BF16 and indexer in BF16_INDEXER_DTYPES
    indexers = (
        fp8_indexers(facts) if in_scope and not both_bf16 else NO_FP8_INDEXER_QUESTION
    )
    for rule in PAIRING_RULES:
        if rule.about_index_cache and (both_bf16 or not in_scope):
            continue
        verdict = rule.check(facts, indexers)
        if verdict is None:
            continue
        if rule.mixed_pool_runs and facts.allow_mixed and _main_cache_runs_here(facts):
            resolved = (
                _uniform_indexer(facts).indexer_kv_dtype
                if (not rule.about_index_cache)
                else indexer
            )
            return _accept_mixed(facts, verdict, resolved)
        return verdict
    return _uniform_indexer(facts)


@dataclass(frozen=True)
class StockPool:
    """What stock vLLM 0.33 builds for the same facts, the plugin off."""

    indexer_kv_dtype: str
    uniform: bool


VLLM_CANNOT_BUILD = "vLLM 0.33 fails to build this MiniMax-M3 KV pool at model build"
"""How a bf16 pool vLLM itself cannot build is reported (by ``check``; the live
hook leaves bf16 pools to vLLM, which raises its own error)."""


def bf16_pool_vllm_cannot_build(facts: PrecisionFacts) -> Verdict | None:
    """A pool with both caches bf16 (the plugin leaves it alone) that vLLM
    0.33 fails to build for a reason the rules above model, as an ERROR
    verdict with vLLM's reason and the fixes that build; None otherwise.

    ``check`` promises what ``vllm serve`` does, so it reports these too.
    """
    both_bf16 = (
        facts.main_cache_precision == BF16
        and facts.indexer_kv_dtype in BF16_INDEXER_DTYPES
    )
    if not both_bf16 or not facts.layers.has_index_cache:
        return None
    reasons = []
    cp = _indexer_cp_needs_rocm_tp(facts)
    if cp is not None:  # select_indexer_impl_cls raises, whatever the dtype
        reasons.append(cp.reason)
    if facts.platform.aiter_sparse_pa and facts.kv_heads_per_rank > 1:
        # minimax_m3_use_aiter_sparse_pa: "MiniMax M3 AITER sparse paged
        # attention requires num_kv_heads == 1 per tensor-parallel rank".
        reasons.append(
            "AITER sparse paged attention serves more than one KV head per "
            "rank only beside the AITER MSA indexer's page table, which needs "
            f"an fp8 index cache, and tensor_parallel_size="
            f"{facts.tensor_parallel_size} leaves {facts.kv_heads_per_rank}"
        )
    if not reasons:
        return None
    fixes = [_bf16_fix(facts, "both caches bf16, as vLLM builds them")]
    fp8 = Fix("fp8 both: an fp8 KV cache", flags=((KV_CACHE_DTYPE_FLAG, "fp8"),))
    if decide(fixed_facts(facts, fp8)).outcome is Outcome.INHERITED:
        fixes.insert(0, fp8)
    return Verdict(
        Outcome.ERROR,
        facts.indexer_kv_dtype,
        f"{VLLM_CANNOT_BUILD}: {_describe(facts)}, both caches bf16.\n"
        f"Because {'; and '.join(reasons)}.",
        fixes=tuple(fixes),
    )


def stock_pool(facts: PrecisionFacts) -> StockPool:
    """Stock vLLM 0.33: ``auto`` is a bf16 index cache whatever the KV cache,
    and an index cache is described by its own dtype with no quantization
    mode, so beside any quantized main cache (fp8 ones included) vLLM counts
    two precisions. Used by ``check`` to say what the plugin changes."""
    indexer = (
        STOCK_INDEXER_DEFAULT
        if facts.indexer_kv_dtype == "auto"
        else facts.indexer_kv_dtype
    )
    kinds = {facts.main_cache_precision}
    if facts.unquantized_dense_layers:
        kinds.add(facts.model_dtype)
    if facts.draft_kv_cache_dtype is not None:
        kinds.add(facts.draft_cache_precision)
    if facts.layers.has_index_cache:
        kinds.add(BF16 if indexer in BF16_INDEXER_DTYPES else f"{indexer} index cache")
    return StockPool(indexer, len(kinds) == 1)
