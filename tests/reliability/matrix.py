"""The reliability matrix: every MiniMax-M3 KV configuration we promise about.

One declared table and one judge. The table is two parts:

- core: the full product of ``PLATFORMS`` x the core KV dtypes x indexer
  dtypes x TP x PP x MTP x indexer CP x max_model_len (plus the off-contract
  checkpoint cells), with the mixed-pool opt-in unset;
- extension (``covering``): the full product of platform x every KV dtype in
  vLLM's own ``KV_CACHE_DTYPES`` (read at run time, so a dtype a platform
  registers is judged too) x indexer dtype x opt-in, each crossed with a
  pairwise covering design over TP, PP, MTP, indexer CP and max_model_len
  (every pair of their values appears; ``covering.py``). The core's
  KV-dtype x opt-in-unset combinations are not repeated.

plus, declared in the same way: platforms without aiter or without its MSA
kernels (``COVERING_ONLY_PLATFORMS``, extension design only), MTP drafters with
their own KV dtype (``drafter_cells``), and one PP stage's specs from a process
without the plugin (``partial_install_cells``, when ``--foreign-stages`` is
given).

Every cell whose two caches are not both bf16 must end in exactly one of:

- ``uniform``: ``create_engine_config`` succeeds, the real model (and MTP
  drafter) builds on the meta device at the cell's TP, and vLLM's planner
  says no zeroing on any worker or the scheduler, at the cell's PP;
- ``mixed`` (only with ``VLLM_MINIMAX_M3_KV_ALLOW_MIXED=1``): it builds and
  the planner says zeroing on every worker and the scheduler;
- ``plugin_error``: a ``ValueError`` from the plugin at config time whose
  every fix, parsed back out of the message text and applied to the cell,
  gives a cell that starts (uniform, or mixed with the opt-in);
- ``vllm_config_error``: vLLM's own config validation refused the input;
- ``simulation_limit``: a KV dtype declared in ``SIMULATION_LIMITS`` whose
  model cannot be built on the CPU simulation (reason stated there).

Cells with both caches bf16, and pools without an index cache that skip
layers do not mix (``Cell.same_as_stock``), must behave exactly as without
the plugin.

``python -m tests.reliability.matrix --platform mi355x-aiter-spa --out f.json``
runs platforms' cells in this process (vLLM fixes its platform once per
process, so the platforms given must simulate one GPU);
``tests/reliability/test_matrix.py`` runs them all and judges.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import traceback
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from tests.reliability.covering import pairwise_rows
from tests.reliability.fix_reader import read_fix_line
from vllm_minimax_m3_kv.config.verdicts import (
    AITER_MSA_REQUIREMENT,
    AITER_REQUIREMENT,
)
from vllm_minimax_m3_kv_sim import engine as sim
from vllm_minimax_m3_kv_sim.environments import AITER_SPARSE_PA
from vllm_minimax_m3_kv_sim.hardware import set_aiter, simulate

AITER_ONLY = {"VLLM_ROCM_USE_AITER": "1", "VLLM_ROCM_SHUFFLE_KV_CACHE_LAYOUT": "0"}
AITER_OFF = {"VLLM_ROCM_USE_AITER": "0", "VLLM_ROCM_SHUFFLE_KV_CACHE_LAYOUT": "0"}

# name -> (simulated hardware, environment, aiter package state on ROCm)
PLATFORMS: dict[str, tuple[str, dict[str, str], str]] = {
    "mi355x-aiter-spa": ("mi355x", AITER_SPARSE_PA, "msa"),
    "mi355x-aiter": ("mi355x", AITER_ONLY, "msa"),
    "mi355x": ("mi355x", AITER_OFF, "msa"),
    "mi300x-aiter-spa": ("mi300x", AITER_SPARSE_PA, "msa"),
    "mi300x": ("mi300x", AITER_OFF, "msa"),
    "sm100": ("b300", {}, "msa"),
    "sm90": ("h200", {}, "msa"),
    "sm80": ("a100", {}, "msa"),  # CUDA without fp8: no fp8 indexer runs on it
    # ROCm machines outside the happy image: aiter absent, or without the MSA
    # kernels, with the AITER variables set and unset. Covering design only.
    "mi355x-no-aiter-env": ("mi355x", AITER_SPARSE_PA, "absent"),
    "mi355x-no-aiter": ("mi355x", AITER_OFF, "absent"),
    "mi355x-aiter-no-msa-env": ("mi355x", AITER_SPARSE_PA, "no_msa"),
    "mi355x-aiter-no-msa": ("mi355x", AITER_OFF, "no_msa"),
    "mi300x-no-aiter-env": ("mi300x", AITER_SPARSE_PA, "absent"),
    "mi300x-no-aiter": ("mi300x", AITER_OFF, "absent"),
    # ROCm with neither gfx950's nor gfx942's fp8 (gfx90a): no fp8 indexer.
    "mi250x-no-aiter": ("mi250x", AITER_OFF, "absent"),
}
COVERING_ONLY_PLATFORMS = frozenset(
    p for p in PLATFORMS if "aiter-no" in p or "no-aiter" in p
)
"""New platform values join the covering design (every KV dtype x indexer x
opt-in over the pairwise shape rows), not the core's full product."""
KV_CACHE_DTYPES = ("auto", "bfloat16", "fp8", "fp8_e4m3", "fp8_e5m2")
"""The core KV dtypes, crossed with everything; the rest come from vLLM."""
INDEXER_KV_DTYPES = (None, "auto", "bf16", "fp8", "fp8_e4m3", "mxfp4")  # None: unset
TENSOR_PARALLEL_SIZES = (1, 2, 4, 8)
PIPELINE_PARALLEL_SIZES = (1, 2)
SPECULATIVE = ("none", "mtp")
INDEXER_CP = (False, True)
# 8K, and one block past what the AITER MSA top-k holds (8192 blocks of 128).
MAX_MODEL_LENS = (8192, 8193 * 128)
_DATA = sim.REPO / "tests" / "data"
CHECKPOINTS = {
    "published": sim.TINY_MODEL,
    # Off the AITER MSA indexer's shape contract (top-k 16 blocks).
    "topk32": str(_DATA / "minimax_m3_tiny_topk32"),
    # sparse_attention_config variants: vLLM builds sparse layers from
    # sparse_attention_freq alone, whatever use_sparse_attention says.
    "key_false": str(_DATA / "minimax_m3_tiny_key_false"),
    "no_sparse": str(_DATA / "minimax_m3_tiny_no_sparse"),
    "dense": str(_DATA / "minimax_m3_tiny_dense"),
    "sparse_first": str(_DATA / "minimax_m3_tiny_sparse_first"),
    # Checkpoints that declare their own KV cache (checkpoint_kv_cells).
    "ct_fp8_kv": sim.TINY_CT_FP8_KV,
    "ct_fp8_kv_sparse_first": sim.TINY_CT_FP8_KV_SPARSE_FIRST,
    "modelopt_fp8": sim.TINY_MODELOPT_FP8,
}
SPARSE_LAYERS = {
    "published": (3, 4),
    "topk32": (3, 4),
    "key_false": (3, 4),
    "no_sparse": (),
    "dense": (),
    "sparse_first": (0, 1),
    "ct_fp8_kv": (3, 4),
    "ct_fp8_kv_sparse_first": (0, 1),
    "modelopt_fp8": (3, 4),
}
"""What each checkpoint's sparse_attention_freq marks (checked by a test)."""
CHECKPOINT_KV = {
    "ct_fp8_kv": "fp8",
    "ct_fp8_kv_sparse_first": "fp8",
    "modelopt_fp8": "fp8_e4m3",
}
"""What ``--kv-cache-dtype auto`` stores with each checkpoint that declares a
KV cache (compressed-tensors kv_cache_scheme; modelopt kv_cache_quant_algo)."""
OFF_CONTRACT_PLATFORMS = ("mi355x-aiter-spa",)
# --kv-cache-dtype-skip-layers: none, a dense layer, a sparse layer, both (of
# the published layout; the variants move which is which).
SKIP_LAYERS = ("", "0", "4", "0,4")

# Per GPU; enough for one request at the longest max_model_len here.
KV_MEMORY_BYTES = 64 << 30
MTP = {"method": "mtp", "num_speculative_tokens": 1}
LONG_CONTEXT_ENV = {"VLLM_ALLOW_LONG_MAX_MODEL_LEN": "1"}
ALLOW_MIXED = ("VLLM_MINIMAX_M3_KV_ALLOW_MIXED", "1")
BF16_ONLY_KV = ("auto", "bfloat16")  # the tiny checkpoint is bf16
BF16_ONLY_INDEXER = (None, "auto", "bf16")

SHAPE_AXES: dict[str, tuple[Any, ...]] = {
    "tensor_parallel_size": TENSOR_PARALLEL_SIZES,
    "pipeline_parallel_size": PIPELINE_PARALLEL_SIZES,
    "speculative": SPECULATIVE,
    "indexer_cp": INDEXER_CP,
    "max_model_len": MAX_MODEL_LENS,
}
SHAPE_ROWS = pairwise_rows(SHAPE_AXES)
"""The extension's covering design over the shape axes (8 rows)."""

_UNSUPPORTED_BY_SIM_BACKEND = (
    "TRITON_ATTN, the attention backend the simulation pins (backend "
    "auto-selection imports GPU kernels), does not store this dtype; on a GPU "
    "vLLM would select another backend"
)
_NEEDS_GPU_TRITON = (
    "its attention layer builds Triton kernels at model build, and vLLM's CPU "
    "Triton placeholder lacks them (tl.bfloat16)"
)
SIMULATION_LIMITS: dict[str, str] = {
    **dict.fromkeys(
        (
            "fp8_inc",
            "fp8_ds_mla",
            "nvfp4_ds_mla",
            "octave_k3v4",
            "octave_k3v3",
            "octave_k3v3_compact",
            "nvfp4",
            "nvfp4_4over6",
        ),
        _UNSUPPORTED_BY_SIM_BACKEND,
    ),
    **dict.fromkeys(
        (
            "turboquant_k8v4",
            "turboquant_4bit_nc",
            "turboquant_k3v4_nc",
            "turboquant_3bit_nc",
            "ultraquant_4bit",
        ),
        _NEEDS_GPU_TRITON,
    ),
}
"""KV dtypes whose model cannot be built here, and why: only a cell that
reaches model build (the opt-in accepted its mixed pool) is affected, and it is
counted as a simulation limit, never as a start."""


# Where each rule's removal must show: a platform and the slice of its cells
# that depend on the rule (the full platform would do, only slower). A rule
# missing here fails test_every_rule_is_listed. Also the rules' share of the
# upstream patch's equivalence cells (tests/upstream/).
RULE_WITNESSES: dict[str, tuple[str, ...]] = {
    "indexer_cp_needs_rocm_tp": ("sm100", "indexer_cp=True"),
    "needs_fp8_capable_gpu": ("sm80", "kv_cache_dtype=fp8"),
    "rocm_msa_needs_gfx950": ("mi300x-aiter-spa", "kv_cache_dtype=fp8"),
    # Without these two, the policy would count on the MSA indexer where
    # vLLM's Triton indexer runs: it differs where indexer CP keeps that bf16.
    "rocm_msa_needs_aiter_installed": ("mi355x-no-aiter-env", "indexer_cp=True"),
    "rocm_msa_needs_aiter_sparse_pa": (
        "mi355x",
        "kv_cache_dtype=fp8",
        "indexer_cp=True",
    ),
    "rocm_msa_shape_contract": ("mi355x-aiter-spa", "checkpoint=topk32"),
    "rocm_msa_topk_block_limit": ("mi355x-aiter-spa", "max_model_len=1048704"),
    "rocm_msa_needs_aiter_msa_kernels": (
        "mi355x-aiter-no-msa-env",
        "kv_cache_dtype=fp8",
    ),
    "rocm_triton_fp8_needs_gfx942_or_gfx950": ("mi250x-no-aiter", "kv_cache_dtype=fp8"),
    "rocm_triton_fp8_needs_no_indexer_cp": ("mi355x", "indexer_cp=True"),
    "rocm_triton_fp8_beside_aiter_sparse_pa": (
        "mi355x-aiter-spa",
        "checkpoint=topk32",
    ),
    "drafter_kv_cache_matches_target": ("sm100", "draft_kv_cache_dtype=auto"),
    "skipped_layers_keep_one_precision": ("mi355x-aiter-spa", "skip_layers=0"),
    "pool_has_an_index_cache": ("sm80", "checkpoint=no_sparse"),
    "fp8_indexer_must_run_here": ("mi250x-no-aiter", "indexer_kv_dtype=fp8"),
    "fp8_indexer_needs_e4m3_main": ("sm100", "indexer_kv_dtype=fp8"),
    "indexer_stores_bf16_or_fp8": ("sm100", "indexer_kv_dtype=mxfp4"),
    "main_cache_matches_an_indexer": ("sm100", "kv_cache_dtype=int8_per_token_head"),
    "auto_indexer_needs_an_fp8_indexer": ("mi250x-no-aiter", "kv_cache_dtype=fp8"),
    "explicit_indexer_matches_fp8_main": ("sm100", "indexer_kv_dtype=bf16"),
}


def vllm_kv_cache_dtypes() -> tuple[str, ...]:
    """vLLM's ``KV_CACHE_DTYPES``: in a process that has imported vLLM (a
    child that runs cells), read now (``register_kv_cache_dtype`` appends to
    it); in one that only lists cells (a test worker), read from vLLM's source
    as ``check`` reads it, without importing vLLM (``test_check_front.py``
    checks the two agree)."""
    if "vllm" in sys.modules:
        from vllm.config.cache import KV_CACHE_DTYPES

        return tuple(KV_CACHE_DTYPES)
    from vllm_minimax_m3_kv.entrypoints.check.early import (
        vllm_kv_cache_dtypes as from_source,
    )

    dtypes = from_source()
    if dtypes is None:
        raise RuntimeError("vLLM's CacheDType could not be read from its source")
    return dtypes


@dataclass(frozen=True)
class Cell:
    platform: str
    kv_cache_dtype: str
    indexer_kv_dtype: str | None
    tensor_parallel_size: int
    pipeline_parallel_size: int
    speculative: str
    indexer_cp: bool
    max_model_len: int
    checkpoint: str = "published"
    env: tuple[tuple[str, str], ...] = ()
    """Environment changes on top of the platform's (from applied fixes)."""
    aiter: str | None = None
    """The aiter package's state when a fix installed it; else the platform's."""
    draft_kv_cache_dtype: str | None = None
    """The MTP drafter's own ``speculative_config.kv_cache_dtype``."""
    foreign_stage: int | None = None
    """A PP stage whose specs come from a process without the plugin, as a
    node without it sends them to the engine core."""
    skip_layers: str = ""
    """``--kv-cache-dtype-skip-layers``, comma-separated."""

    @property
    def id(self) -> str:
        parts = [
            self.platform,
            f"kv={self.kv_cache_dtype}",
            f"indexer={self.indexer_kv_dtype or 'unset'}",
            f"tp{self.tensor_parallel_size}",
            f"pp{self.pipeline_parallel_size}",
            self.speculative,
            "cp" if self.indexer_cp else "nocp",
            f"len{self.max_model_len}",
            self.checkpoint,
        ]
        parts += [f"{k}={v}" for k, v in self.env]
        if self.aiter is not None:
            parts.append(f"aiter={self.aiter}")
        if self.draft_kv_cache_dtype is not None:
            parts.append(f"draft_kv={self.draft_kv_cache_dtype}")
        if self.foreign_stage is not None:
            parts.append(f"stage{self.foreign_stage}_without_plugin")
        if self.skip_layers:
            parts.append(f"skip={self.skip_layers}")
        return "/".join(parts)

    @property
    def aiter_state(self) -> str:
        return self.aiter or PLATFORMS[self.platform][2]

    @property
    def main_kv_cache_dtype(self) -> str:
        """What the main cache stores: ``auto`` is the checkpoint's KV cache
        where it declares one."""
        if self.kv_cache_dtype == "auto":
            return CHECKPOINT_KV.get(self.checkpoint, "auto")
        return self.kv_cache_dtype

    @property
    def bf16_only(self) -> bool:
        """Both caches bf16: the plugin must leave these exactly as stock."""
        return (
            self.main_kv_cache_dtype in BF16_ONLY_KV
            and self.indexer_kv_dtype in BF16_ONLY_INDEXER
            and self.draft_kv_cache_dtype in (None, *BF16_ONLY_KV)
        )

    @property
    def allow_mixed(self) -> bool:
        return ALLOW_MIXED in self.env

    @property
    def has_index_cache(self) -> bool:
        """Sparse layers in the checkpoint, or the MTP drafter (built sparse)."""
        return bool(SPARSE_LAYERS[self.checkpoint]) or self.speculative == "mtp"

    @property
    def skips_quantized_dense_layer(self) -> bool:
        """A dense layer kept unquantized beside a quantized main cache."""
        dense = {
            int(layer)
            for layer in self.skip_layers.split(",")
            if layer and int(layer) not in SPARSE_LAYERS[self.checkpoint]
        }
        return bool(dense) and self.main_kv_cache_dtype not in BF16_ONLY_KV

    @property
    def same_as_stock(self) -> bool:
        """The plugin must leave these exactly as stock vLLM: both caches
        bf16, or a pool with no index cache that skip layers do not mix."""
        return self.bf16_only or not (
            self.has_index_cache or self.skips_quantized_dense_layer
        )

    def engine(self) -> dict[str, Any]:
        attention: dict[str, Any] = {"minimax_m3_indexer_cp": self.indexer_cp}
        if self.indexer_kv_dtype is not None:
            attention["indexer_kv_dtype"] = self.indexer_kv_dtype
        return {
            "model": CHECKPOINTS[self.checkpoint],
            "kv_cache_dtype": self.kv_cache_dtype,
            "kv_cache_dtype_skip_layers": [
                layer for layer in self.skip_layers.split(",") if layer
            ],
            "tensor_parallel_size": self.tensor_parallel_size,
            "pipeline_parallel_size": self.pipeline_parallel_size,
            "speculative_config": self._speculative_config(),
            "max_model_len": self.max_model_len,
            "attention_config": attention,
        }

    def _speculative_config(self) -> dict[str, Any] | None:
        if self.speculative != "mtp":
            return None
        if self.draft_kv_cache_dtype is None:
            return MTP
        return {**MTP, "kv_cache_dtype": self.draft_kv_cache_dtype}

    def environment(self) -> dict[str, str]:
        env = dict(PLATFORMS[self.platform][1])
        if self.max_model_len > 524288:  # the checkpoint's own limit
            env.update(LONG_CONTEXT_ENV)
        env.update(self.env)
        return env


SIZES = ("quick", "full")
"""``full`` (CI): the core's shape axes in full product; the extension's and
the pool-shape part's over their pairwise rows. ``quick`` (the default test
run): every verdict combination of the core, and of the extension every KV
dtype x opt-in with the indexer unset or fp8, each over one shape row,
rotating so every row still appears; the pool-shape part on three platforms
with its verdict axes halved. Both sizes hold every rule's witness slice and
the launch scripts' recipe cells (tests check)."""
QUICK_INDEXER_KV_DTYPES = (None, "fp8")


def _rows(size: str, index: int) -> list[dict[str, Any]]:
    """The shape rows for the ``index``-th verdict combination of a part."""
    if size == "full":
        return SHAPE_ROWS
    return [SHAPE_ROWS[index % len(SHAPE_ROWS)]]


def cells(platform: str, size: str = "full") -> list[Cell]:
    """The declared table, for one platform."""
    if platform in COVERING_ONLY_PLATFORMS:
        return extension_cells(platform, size, with_core_kv=True)
    verdict_axes = list(itertools.product(KV_CACHE_DTYPES, INDEXER_KV_DTYPES))
    if size == "full":
        table = [
            Cell(platform, kv, indexer, *shape)
            for kv, indexer in verdict_axes
            for shape in itertools.product(
                TENSOR_PARALLEL_SIZES,
                PIPELINE_PARALLEL_SIZES,
                SPECULATIVE,
                INDEXER_CP,
                MAX_MODEL_LENS,
            )
        ]
    else:
        table = [
            Cell(platform, kv, indexer, **row)
            for index, (kv, indexer) in enumerate(verdict_axes)
            for row in _rows(size, index)
        ]
    if platform in OFF_CONTRACT_PLATFORMS:
        table += [
            Cell(platform, kv, indexer, tp, 1, "none", False, 8192, "topk32")
            for kv, indexer, tp in itertools.product(
                KV_CACHE_DTYPES, INDEXER_KV_DTYPES, (1, 8)
            )
        ]
    every = (
        table
        + recipe_cells(platform, table)
        + extension_cells(platform, size)
        + pool_shape_cells(platform, size)
        + drafter_cells(platform, size)
        + checkpoint_kv_cells(platform, size)
        + partial_install_cells(platform)
    )
    # The parts overlap where an axis value is also a core row (e.g. the
    # published checkpoint at TP 1): one cell per id, first one kept.
    unique: dict[str, Cell] = {}
    for cell in every:
        unique.setdefault(cell.id, cell)
    return list(unique.values())


RECIPES = {
    # The launch scripts' fp8 recipe with MTP, on one 8-GPU node (TP 8) and
    # on two 4-GPU stages (TP 4 x PP 2): indexer dtype explicit (as the
    # scripts set it) or auto.
    "mi355x-aiter-spa": ("fp8",),
    "sm100": ("fp8",),
}


def recipe_cells(platform: str, already: list[Cell]) -> list[Cell]:
    """The recipes' own cells, in every size."""
    cells = [
        Cell(platform, kv, indexer, tp, pp, "mtp", False, 8192)
        for kv in RECIPES.get(platform, ())
        for indexer in (None, "fp8")
        for tp, pp in ((8, 1), (4, 2))
    ]
    return [cell for cell in cells if cell not in already]


def _row_cell(
    platform: str, kv: str, indexer: str | None, opt_in: bool, row: dict[str, Any]
) -> Cell:
    """A covering-design row's cell at 8K, indexer CP off, the opt-in as asked."""
    return Cell(
        platform,
        kv,
        indexer,
        indexer_cp=False,
        max_model_len=8192,
        env=(ALLOW_MIXED,) if opt_in else (),
        **row,
    )


POOL_SHAPE_PLATFORMS = ("mi355x-aiter-spa", "mi355x", "mi300x", "sm100", "sm80")
POOL_SHAPE_KV = ("auto", "fp8", "fp8_e5m2")
POOL_SHAPE_INDEXER = (None, "bf16", "fp8")
POOL_SHAPE_AXES: dict[str, tuple[Any, ...]] = {
    "checkpoint": ("published", "key_false", "no_sparse", "dense", "sparse_first"),
    "skip_layers": SKIP_LAYERS,
    "tensor_parallel_size": (1, 8),
    "pipeline_parallel_size": PIPELINE_PARALLEL_SIZES,
    "speculative": SPECULATIVE,
}
POOL_SHAPE_ROWS = pairwise_rows(POOL_SHAPE_AXES)
"""The pool-shape part's covering design: every pair of checkpoint variant,
skip layers, TP, PP and MTP values appears."""


QUICK_POOL_SHAPE_PLATFORMS = ("mi355x-aiter-spa", "mi355x", "sm100", "sm80")
QUICK_POOL_SHAPE_SHARE = 4


def pool_shape_cells(platform: str, size: str = "full") -> list[Cell]:
    """Which layers hold which caches: checkpoint variants (which layers
    sparse_attention_freq makes sparse, whatever use_sparse_attention says)
    and --kv-cache-dtype-skip-layers. Full product over platform x KV dtype x
    indexer x opt-in, each crossed with the pairwise rows above."""
    if platform not in POOL_SHAPE_PLATFORMS:
        return []
    kvs, indexers = POOL_SHAPE_KV, POOL_SHAPE_INDEXER
    if size == "quick":
        if platform not in QUICK_POOL_SHAPE_PLATFORMS:
            return []
        kvs, indexers = ("auto", "fp8"), (None, "fp8")
    verdicts = list(itertools.product(kvs, indexers, (False, True)))
    return [
        _row_cell(platform, kv, indexer, opt_in, row)
        for index, (kv, indexer, opt_in) in enumerate(verdicts)
        for number, row in enumerate(POOL_SHAPE_ROWS)
        # Quick: an fp8 KV cache without the opt-in (where a skipped layer
        # must be refused) on every row; each other verdict on a rotating
        # quarter of them.
        if size == "full"
        or (kv == "fp8" and not opt_in)
        or (number + index) % QUICK_POOL_SHAPE_SHARE == 0
    ]


PARTIAL_INSTALL_PLATFORMS = ("mi355x-aiter-spa", "sm100")
_foreign_stages: Path | None = None
"""Where the stock child wrote its stage specs (``--foreign-stages``)."""


def partial_install_cells(platform: str) -> list[Cell]:
    """PP 2 at TP 4 (one 8-GPU job on two nodes), one stage from a node
    without the plugin; only when a stock child has written those stages."""
    if platform not in PARTIAL_INSTALL_PLATFORMS or _foreign_stages is None:
        return []
    return [
        Cell(platform, "fp8", indexer, 4, 2, spec, False, 8192, foreign_stage=stage)
        for indexer, spec, stage in itertools.product(
            (None, "fp8"), SPECULATIVE, (0, 1)
        )
    ]


def _stock_stages_file(platform: str, speculative: str) -> Path:
    assert _foreign_stages is not None
    return _foreign_stages / f"{platform}-{speculative}.pkl"


def dump_stock_stages(platform: str) -> None:
    """In a process without the plugin: the PP stages of the configuration
    the front end resolved (fp8 KV and fp8 indexer), as that node builds them."""
    import pickle

    for speculative in SPECULATIVE:
        cell = Cell(platform, "fp8", "fp8", 4, 2, speculative, False, 8192)
        with sim.environment(cell.environment()):
            config = sim.make_engine_args(cell.engine()).create_engine_config()
            built = sim.build_model(config)
            stages = sim.pp_stages(config, built, 2)
        _stock_stages_file(platform, speculative).write_bytes(pickle.dumps(stages))


DRAFTER_PLATFORMS = ("mi355x-aiter-spa", "mi355x", "sm100")
DRAFT_KV_CACHE_DTYPES = (
    "auto",
    "bfloat16",
    "fp8",
    "fp8_e4m3",
    "fp8_e5m2",
    "int8_per_token_head",
)


def drafter_cells(platform: str, size: str = "full") -> list[Cell]:
    """The MTP drafter with its own KV dtype, beside an fp8 or bf16 target.
    Quick: PP 1 and 2 alternate over the (target, drafter) pairs."""
    if platform not in DRAFTER_PLATFORMS:
        return []
    pairs = list(itertools.product(("fp8", "auto"), DRAFT_KV_CACHE_DTYPES))
    return [
        Cell(
            platform,
            kv,
            None,
            8,
            pp,
            "mtp",
            False,
            8192,
            env=(ALLOW_MIXED,) if opt_in else (),
            draft_kv_cache_dtype=draft,
        )
        for index, (kv, draft) in enumerate(pairs)
        for pp, opt_in in itertools.product((1, 2), (False, True))
        if size == "full" or pp == 1 + index % 2
    ]


CHECKPOINT_KV_PLATFORMS = {
    "mi355x-aiter-spa": ("ct_fp8_kv", "ct_fp8_kv_sparse_first"),
    "mi355x": ("ct_fp8_kv", "ct_fp8_kv_sparse_first"),
    "mi300x": ("ct_fp8_kv",),
    # modelopt's FP8 weights are a CUDA format: judged on CUDA only.
    "sm100": ("modelopt_fp8", "ct_fp8_kv"),
}
CHECKPOINT_KV_FLAGS = ("auto", "bfloat16", "fp8")
CHECKPOINT_KV_INDEXERS = (None, "bf16", "fp8")
CHECKPOINT_SHAPE_AXES: dict[str, tuple[Any, ...]] = {
    "tensor_parallel_size": (1, 8),
    "pipeline_parallel_size": PIPELINE_PARALLEL_SIZES,
    "speculative": SPECULATIVE,
}
CHECKPOINT_SHAPE_ROWS = pairwise_rows(CHECKPOINT_SHAPE_AXES)
"""The checkpoint part's covering design: every pair of TP, PP and MTP."""


def checkpoint_kv_cells(platform: str, size: str = "full") -> list[Cell]:
    """Checkpoints that declare their own KV cache, in both layer orders:
    full product over checkpoint x ``--kv-cache-dtype`` (auto: the
    checkpoint's) x indexer x opt-in, each crossed with the pairwise rows
    above. Quick: ``auto`` only (the applied fixes add bfloat16), each verdict
    over one rotating row."""
    checkpoints = CHECKPOINT_KV_PLATFORMS.get(platform, ())
    kvs = CHECKPOINT_KV_FLAGS if size == "full" else ("auto",)
    verdicts = list(
        itertools.product(checkpoints, kvs, CHECKPOINT_KV_INDEXERS, (False, True))
    )
    return [
        _row_cell(platform, kv, indexer, opt_in, {"checkpoint": checkpoint, **row})
        for index, (checkpoint, kv, indexer, opt_in) in enumerate(verdicts)
        for number, row in enumerate(CHECKPOINT_SHAPE_ROWS)
        if size == "full" or number == index % len(CHECKPOINT_SHAPE_ROWS)
    ]


def extension_cells(
    platform: str, size: str = "full", with_core_kv: bool = False
) -> list[Cell]:
    """Every vLLM KV dtype x indexer x opt-in, over the shape covering design."""
    indexers = INDEXER_KV_DTYPES if size == "full" else QUICK_INDEXER_KV_DTYPES
    # Quick: a machine outside the happy image takes the core KV dtypes only;
    # every vLLM KV dtype still runs on each core platform.
    kvs = (
        KV_CACHE_DTYPES if size == "quick" and with_core_kv else vllm_kv_cache_dtypes()
    )
    combinations = [
        (kv, indexer, opt_in)
        for kv, opt_in in itertools.product(kvs, (False, True))
        # The core product has these.
        if with_core_kv or opt_in or kv not in KV_CACHE_DTYPES
        for indexer in indexers
    ]
    return [
        Cell(platform, kv, indexer, **row, env=(ALLOW_MIXED,) if opt_in else ())
        for index, (kv, indexer, opt_in) in enumerate(combinations)
        for row in _rows(size, index)
    ]


# -- fixes, as a user would apply them ---------------------------------------

WITHOUT_FIELDS = {"--kv-cache-dtype-skip-layers": ("skip_layers", "")}
"""A flag a fix removes -> the cell field and its value without the flag."""
FLAG_FIELDS = {
    "--kv-cache-dtype": "kv_cache_dtype",
    "--attention-config.indexer_kv_dtype": "indexer_kv_dtype",
    "--attention-config.minimax_m3_indexer_cp": "indexer_cp",
    "--max-model-len": "max_model_len",
    "--speculative-config.kv_cache_dtype": "draft_kv_cache_dtype",
}


def parse_fixes(message: str) -> list[dict[str, Any]]:
    """The fixes a user reads in the error text, as env and flag pairs."""
    if "Fix with one of:" not in message:
        return []
    lines = message.split("Fix with one of:", 1)[1].strip().splitlines()
    return [
        {
            "env": dict(fix.env),
            "flags": [list(pair) for pair in fix.flags],
            "requires": list(fix.requires),
            "without": list(fix.without),
        }
        for fix in map(read_fix_line, lines)
    ]


# What a user installs for each requirement, as the stand-in applies it.
INSTALLS = {
    AITER_REQUIREMENT: "msa",
    AITER_MSA_REQUIREMENT: "msa",
}


def apply_fix(cell: Cell, fix: dict[str, Any]) -> Cell:
    changes: dict[str, Any] = {}
    for requirement in fix.get("requires", []):
        changes["aiter"] = INSTALLS[requirement]  # unknown: a defect in the text
    for flag in fix.get("without", []):
        field, value = WITHOUT_FIELDS[flag]  # unknown: a defect in the text
        changes[field] = value
    for flag, value in fix["flags"]:
        field = FLAG_FIELDS[flag]  # an unknown flag is a defect in the message
        if field == "indexer_cp":
            changes[field] = {"true": True, "false": False}[value.lower()]
        elif field == "max_model_len":
            changes[field] = int(value)
        else:
            changes[field] = value
    env = dict(cell.env)
    env.update(fix["env"])
    return replace(cell, **changes, env=tuple(sorted(env.items())))


# -- running a cell -----------------------------------------------------------

_builds: dict[tuple, dict[str, Any]] = {}

_NOT_READ_BY_THE_BUILD = (
    "platform",  # its GPU, environment and aiter state are in the key
    "env",
    "aiter",
    "pipeline_parallel_size",  # the stage split happens after the build
    "foreign_stage",  # replaces a stage's specs after the build
    "indexer_kv_dtype",  # as asked (unset, "auto", explicit): the resolved one is in
)


def _build_key(cell: Cell, vllm_config: Any) -> tuple:
    """What the model build reads: the simulated GPU, the environment and
    aiter state it runs with (less the opt-in, which only lets a config
    through), the cell's shape, and the config's resolved dtypes. Cells that
    reach the same build this way share it (e.g. an indexer left unset and one
    set to what "auto" resolves to; a platform's cell and another platform's
    cell after a fix set the same variables)."""
    environment = cell.environment()
    environment.pop(ALLOW_MIXED[0], None)
    shape = asdict(cell)
    for name in _NOT_READ_BY_THE_BUILD:
        del shape[name]
    return (
        PLATFORMS[cell.platform][0],
        tuple(sorted(environment.items())),
        cell.aiter_state,
        tuple(sorted(shape.items())),
        vllm_config.cache_config.cache_dtype,
        vllm_config.attention_config.indexer_kv_dtype,
    )


def _build_and_plan(cell: Cell, vllm_config: Any) -> dict[str, Any]:
    key = _build_key(cell, vllm_config)
    build_config = vllm_config
    if cell.indexer_cp and cell.tensor_parallel_size > 1:
        # The CP indexers map peer buffers in GPU IPC memory at build, which a
        # CPU cannot stand in for. CP shards indexer work, not the KV cache
        # (AttentionConfig.minimax_m3_indexer_cp), so the specs are the same.
        build_config = replace(
            vllm_config,
            attention_config=replace(
                vllm_config.attention_config, minimax_m3_indexer_cp=False
            ),
        )
    if key not in _builds:
        try:
            built = sim.build_model(build_config)
        except Exception as error:
            _builds[key] = {
                "build_error": sim.describe_error(error),
                "traceback": traceback.format_exc(limit=-2),
            }
        else:
            _builds[key] = {"built": built}
    entry = _builds[key]
    if "built" not in entry:
        return entry
    built = entry["built"]
    if build_config is not vllm_config:
        refused = sim.cp_indexer_selection_error(vllm_config, built)
        if refused is not None:
            return {"build_error": refused}
    stages = sim.pp_stages(build_config, built, cell.pipeline_parallel_size)
    if cell.foreign_stage is not None:
        import pickle

        theirs = pickle.loads(
            _stock_stages_file(cell.platform, cell.speculative).read_bytes()
        )
        stages[cell.foreign_stage] = theirs[cell.foreign_stage]
    try:
        plan = sim.plan(build_config, stages, KV_MEMORY_BYTES)
    except Exception as error:
        return {"plan_error": sim.describe_error(error)}
    return {
        "missing_kernels": _missing_msa_kernels(built) if _on_rocm(cell) else [],
        "precisions": sorted(
            {f"{spec.dtype}/{spec.kv_quant_mode.name}" for spec in built.specs.values()}
        ),
        "layers": len(built.specs),
        "draft_layers": len(built.draft_layers),
        "plan": plan,
    }


# What MiniMaxM3IndexerMSAImpl imports from aiter: in its CP gate at model
# build (TP > 1) and in its kernel launches at the first forward, neither of
# which a CPU reaches, so the judge asks the import system directly.
MSA_KERNEL_MODULES = ("aiter.ops.msa_block_select", "aiter.ops.msa_attention")


def _missing_msa_kernels(built: Any) -> list[str]:
    import importlib

    if not any("MSA" in name for name in built.selected.get("indexer_impls", [])):
        return []
    missing = []
    for module in MSA_KERNEL_MODULES:
        try:
            importlib.import_module(module)
        except ImportError:
            missing.append(module)
    return missing


_results: dict[Cell, dict[str, Any]] = {}


def run_cell(cell: Cell) -> dict[str, Any]:
    """Config, model, planner: what real vLLM does with this cell."""
    if cell not in _results:
        _results[cell] = _run_cell(cell)
    return _results[cell]


_aiter_now: str | None = None


def _on_rocm(cell: Cell) -> bool:
    return _on_rocm_hardware(PLATFORMS[cell.platform][0])


def _use_aiter(cell: Cell) -> None:
    global _aiter_now
    if _on_rocm(cell) and cell.aiter_state != _aiter_now:
        set_aiter(cell.aiter_state)
        _aiter_now = cell.aiter_state


def _run_cell(cell: Cell) -> dict[str, Any]:
    _use_aiter(cell)
    with sim.environment(cell.environment()):
        try:
            vllm_config = sim.make_engine_args(cell.engine()).create_engine_config()
        except Exception as error:
            return {"config_error": sim.describe_error(error)}
        result = {
            "kv_cache_dtype": vllm_config.cache_config.cache_dtype,
            "indexer_kv_dtype": vllm_config.attention_config.indexer_kv_dtype,
        }
        result.update(_build_and_plan(cell, vllm_config))
    return result


def starts(result: dict[str, Any]) -> bool:
    """Built, planned, and no worker or scheduler would zero blocks."""
    plan = result.get("plan")
    return (
        plan is not None
        and not result.get("missing_kernels")
        and not any(plan["workers"])
        and not any(plan["worker_mixed"])
        and not plan["scheduler"]
    )


def starts_mixed(result: dict[str, Any]) -> bool:
    """Built and planned mixed, with every worker and the scheduler zeroing."""
    plan = result.get("plan")
    return (
        plan is not None
        and not result.get("missing_kernels")
        and any(plan["worker_mixed"])
        and all(plan["workers"])
        and plan["scheduler"]
    )


def start_outcome(cell: Cell, result: dict[str, Any]) -> str | None:
    """How a cell that passed config starts: uniform, mixed, a declared
    simulation limit, or None (it does not start as promised)."""
    if starts(result):
        return "uniform"
    if cell.allow_mixed and starts_mixed(result):
        return "mixed"
    build_error = result.get("build_error")
    # Only an opted-in mixed pool may reach model build with these dtypes;
    # without the opt-in the plugin must have refused it at config time.
    if (
        cell.allow_mixed
        and build_error is not None
        and not build_error["from_plugin"]
        and cell.kv_cache_dtype in SIMULATION_LIMITS
    ):
        return "simulation_limit"
    return None


def judge(cell: Cell, result: dict[str, Any]) -> dict[str, Any]:
    """A judged cell's verdict (see the module docstring), or defect."""
    error = result.get("config_error")
    partial = result.get("plan_error", {})
    if partial.get("type") == "PartialInstallError":
        # Refused at KV planning, naming the stage; the fix is the plugin on
        # that node, i.e. the same cell with every stage built with it.
        named = f"pipeline stage {cell.foreign_stage} of" in partial["message"]
        if named and starts(run_cell(replace(cell, foreign_stage=None))):
            return {"outcome": "plugin_error", "fixes": 1}
        return {"outcome": "defect", "why": "partial install", "result": result}
    if error is None:
        outcome = start_outcome(cell, result)
        if outcome is not None:
            return {"outcome": outcome}
        return {
            "outcome": "defect",
            "why": "did not start as promised",
            "result": result,
        }
    if not error["from_plugin"]:
        if error["type"] == "ValueError":
            # vLLM's own config validation refused the input before the plugin
            # ran (e.g. indexer CP with an mxfp4 index cache).
            return {"outcome": "vllm_config_error", "message": error["message"]}
        return {"outcome": "defect", "why": "non-plugin config error", "result": result}
    fixes = parse_fixes(error["message"])
    if not fixes or fixes != error["fixes"]:
        return {
            "outcome": "defect",
            "why": "fixes in the message differ from the structured fixes",
            "result": result,
            "parsed": fixes,
        }
    for fix in fixes:
        fixed = apply_fix(cell, fix)
        after = run_cell(fixed)
        if "config_error" in after or start_outcome(fixed, after) is None:
            return {
                "outcome": "defect",
                "why": f"fix {fix} does not start",
                "message": error["message"],
                "fixed_cell": fixed.id,
                "after": after,
            }
    return {"outcome": "plugin_error", "fixes": len(fixes)}


def comparable(result: dict[str, Any]) -> dict[str, Any]:
    """What must match between runs with and without the plugin."""
    view = {k: v for k, v in result.items() if k != "traceback"}
    if "config_error" in view:
        view["config_error"] = {
            key: view["config_error"][key] for key in ("type", "message")
        }
    if "build_error" in view:
        view["build_error"] = {
            key: view["build_error"][key] for key in ("type", "message")
        }
    return view


def outcome_class(cell: Cell, result: dict[str, Any]) -> str:
    """What a user sees of a cell, whoever decided it: refused at config
    time, started uniform (with which indexer dtype), started mixed, or how
    it failed later. Messages are left out: they may differ between a plugin
    and an upstream fix that agree."""
    error = result.get("config_error")
    if error is not None:
        # IndexerPrecisionError is the plugin's ValueError.
        kind = "ValueError" if error["from_plugin"] else error["type"]
        return "config_error" if kind == "ValueError" else f"config_error:{kind}"
    start = start_outcome(cell, result)
    if start == "uniform":
        return f"uniform/indexer={result['indexer_kv_dtype']}"
    if start is not None:
        return start
    if result.get("missing_kernels"):
        return "msa_kernels_missing"
    for stage in ("build_error", "plan_error"):
        if stage in result:
            return f"{stage}:{result[stage]['type']}"
    return "zeroing_needed"


def matches(cell: Cell, where: dict[str, str]) -> bool:
    """Whether a cell has every ``FIELD=VALUE`` of ``where`` (as on the CLI)."""
    return all(str(getattr(cell, k)) == v for k, v in where.items())


_hardware: str | None = None


def use_platform(platform: str) -> None:
    """Simulate a platform's hardware (once per process) and its aiter state."""
    global _aiter_now, _hardware
    hardware, _, aiter = PLATFORMS[platform]
    if _hardware is None:
        simulate(hardware, aiter)
        _hardware = hardware
    assert hardware == _hardware, (hardware, _hardware)
    if _on_rocm_hardware(hardware) and aiter != _aiter_now:
        set_aiter(aiter)
    _aiter_now = aiter


def _on_rocm_hardware(hardware: str) -> bool:
    return hardware.startswith("mi")


def hardware_groups(platforms: list[str] | tuple[str, ...]) -> list[list[str]]:
    """Platforms by the hardware they simulate: one process each."""
    groups: dict[str, list[str]] = {}
    for platform in platforms:
        groups.setdefault(PLATFORMS[platform][0], []).append(platform)
    return list(groups.values())


def run_platform(
    platform: str,
    size: str = "full",
    same_as_stock: bool = False,
    stop_at_defect: bool = False,
    where: dict[str, str] | None = None,
) -> list[dict[str, Any]]:
    """Every cell of one platform, in this process."""
    use_platform(platform)
    records = []
    for cell in cells(platform, size):
        if same_as_stock and not cell.same_as_stock:
            continue
        if not matches(cell, where or {}):
            continue
        result = run_cell(cell)
        record: dict[str, Any] = {
            "cell": asdict(cell),
            "id": cell.id,
            "class": outcome_class(cell, result),
        }
        if cell.same_as_stock:
            # Compared with a run without the plugin; a plugin refusal here
            # can only be wrong (and shows in this process already).
            record["result"] = comparable(result)
            if result.get("config_error", {}).get("from_plugin"):
                record["verdict"] = {
                    "outcome": "defect",
                    "why": "the plugin refused a pool it must leave as stock",
                    "result": result,
                }
        else:
            record["verdict"] = judge(cell, result)
        records.append(record)
        if stop_at_defect and record.get("verdict", {}).get("outcome") == "defect":
            break
    return records


RULE_TABLES = (
    ("vllm_gates", "FP8_INDEXER_RULES"),
    ("indexer_precision", "PAIRING_RULES"),
    ("indexer_precision", "DRAFTER_RULES"),
    ("indexer_precision", "SCOPE_RULES"),
)
"""Each rule table, by the policy module that reads it."""


def run_mutant(rule: str, size: str = "full") -> list[str]:
    """Mutation testing: the rule's witness slice with that one rule taken out
    of the policy. Returns the ids of the cells that then fail (the first)."""
    import importlib

    from vllm_minimax_m3_kv.config.indexer_precision import decide

    tables = [
        (importlib.import_module(f"vllm_minimax_m3_kv.config.{module}"), name)
        for module, name in RULE_TABLES
    ]
    saved = {(module, name): getattr(module, name) for module, name in tables}
    for (module, name), rules in saved.items():
        setattr(module, name, tuple(r for r in rules if r.name != rule))
    decide.cache_clear()  # verdicts remembered under the full tables
    assert sum(len(getattr(module, name)) for module, name in tables) == (
        sum(map(len, saved.values())) - 1
    ), rule
    # Outcomes depend on the rules: judge the slice afresh, then restore.
    _results.clear()
    try:
        platform, *where = RULE_WITNESSES[rule]
        records = run_platform(
            platform,
            size,
            stop_at_defect=True,
            where=dict(item.split("=", 1) for item in where),
        )
    finally:
        for (module, name), rules in saved.items():
            setattr(module, name, rules)
        decide.cache_clear()
        _results.clear()
    return [r["id"] for r in records if r.get("verdict", {}).get("outcome") == "defect"]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument(
        "--platform",
        choices=sorted(PLATFORMS),
        action="append",
        help="repeatable: platforms of one simulated GPU share a process",
    )
    parser.add_argument("--out", required=True)
    parser.add_argument("--size", choices=SIZES, default="full")
    parser.add_argument(
        "--same-as-stock",
        action="store_true",
        help="only the cells the plugin must leave as stock (run without it)",
    )
    parser.add_argument(
        "--foreign-stages",
        metavar="DIR",
        help="stage specs from a process without the plugin (see --dump-stock-stages)",
    )
    parser.add_argument(
        "--dump-stock-stages",
        action="store_true",
        help="write this platform's stages to --foreign-stages and exit",
    )
    parser.add_argument(
        "--mutants",
        nargs="+",
        metavar="RULE",
        help="for each rule, its witness slice with the rule taken out",
    )
    parser.add_argument("--stop-at-defect", action="store_true")
    parser.add_argument(
        "--where",
        action="append",
        default=[],
        metavar="FIELD=VALUE",
        help="only cells whose field has this value (repeatable)",
    )
    options = parser.parse_args()
    global _foreign_stages
    if options.foreign_stages:
        _foreign_stages = Path(options.foreign_stages)
    out = Path(options.out)
    if options.mutants:
        found = {rule: run_mutant(rule, options.size) for rule in options.mutants}
        out.write_text(json.dumps(found))
        return
    if options.dump_stock_stages:
        for platform in options.platform:
            use_platform(platform)
            dump_stock_stages(platform)
        out.write_text("{}")
        return
    records = {
        platform: run_platform(
            platform,
            options.size,
            same_as_stock=options.same_as_stock,
            stop_at_defect=options.stop_at_defect,
            where=dict(item.split("=", 1) for item in options.where),
        )
        for platform in options.platform
    }
    out.write_text(json.dumps(records))


if __name__ == "__main__":
    sys.exit(main())
