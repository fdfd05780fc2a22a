"""The facts the MiniMax-M3 KV precision policy reads: the platform, the
pool's layers, the flags, as frozen values (gathered from vLLM's config by
:mod:`.facts`, or for a ``--target`` by ``check``), and the names of the
flags and dtypes they speak of. Nothing here imports vLLM."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

FP8_E4M3 = "fp8_e4m3"
"""The precision every fp8 indexer stores; also a spelling of it in both
``--kv-cache-dtype`` and ``indexer_kv_dtype``."""

FP8_E4M3_DTYPES = frozenset({"fp8", FP8_E4M3})
"""The spellings of fp8 e4m3, the same in ``--kv-cache-dtype`` and
``indexer_kv_dtype``: the main caches' bytes and every fp8 indexer's."""


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
    """MI300X/MI325X."""
    fp8_fnuz: bool = False
    """vLLM stores fp8 as e4m3fnuz here (``current_platform.is_fp8_fnuz()``:
    gfx942), not OCP e4m3fn."""
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
        (``current_platform.fp8_dtype()``)."""
        return "e4m3fnuz" if self.fp8_fnuz else "e4m3fn"

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


def kv_cache_dtype_for(flag: str, auto_kv_cache_dtype: str | None) -> str:
    """What a ``--kv-cache-dtype`` value stores, given what ``auto`` gives
    (None: the model dtype, spelled ``auto``)."""
    return (auto_kv_cache_dtype or flag) if flag == "auto" else flag


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
        return kv_cache_dtype_for(flag, self.auto_kv_cache_dtype)

    def _precision(self, kv_cache_dtype: str) -> str:
        if kv_cache_dtype == "auto":
            return self.model_dtype
        if kv_cache_dtype in FP8_E4M3_DTYPES:
            return FP8_E4M3
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
