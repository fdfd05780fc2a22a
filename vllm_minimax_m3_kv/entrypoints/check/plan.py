"""The plan: what ``vllm serve`` will build for this command on the target
(both caches' dtypes, the drafter's, each pipeline stage's where it differs,
the zeroer, bytes per token, capacity against stock vLLM 0.33 running the same
command, each fix's), and its rendering as rows. Built by :mod:`.pool`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from vllm_minimax_m3_kv.config.pool_facts import FP8_E4M3_DTYPES
from vllm_minimax_m3_kv.config.verdicts import Outcome
from vllm_minimax_m3_kv.entrypoints.check.arguments import (
    EXIT_MIXED,
    EXIT_OK,
    EXIT_REFUSED,
)
from vllm_minimax_m3_kv.entrypoints.output import aligned


@dataclass(frozen=True)
class Plan:
    architecture: str
    target: str
    kv_cache_dtype: str
    indexer_kv_dtype: str
    indexer_inherited: bool
    uniform_precision: bool
    kv_block_zeroer: str
    tensor_parallel_size: int
    bytes_per_token_main: int
    bytes_per_token_indexer: int
    bytes_per_token_total: int
    stock_bytes_per_token_total: int
    token_capacity_vs_stock: float
    outcome: Outcome
    message: str
    notes: list[str]
    headline: str = ""
    """The verdict in one line (``message``'s first)."""
    plugin: str = "on"
    executor_note: str = ""
    kv_cache_dtype_source: str = "--kv-cache-dtype"
    """Where the main KV dtype came from: the flag, or the checkpoint."""
    not_judged: str = ""
    """Flags of the command this check set aside, and why."""
    model_note: str = ""
    fixes: list[dict[str, Any]] = field(default_factory=list)
    """Each fix of a refusal: ``line`` (what pastes into a shell), ``env``,
    ``flags``, ``remove`` (flags to drop), ``requires`` (software)."""
    versions: str = ""
    fp8_indexer: str = ""
    """Which indexer runs the fp8 index cache, where the platform has two
    (ROCm: vLLM's Triton indexer or the AITER MSA indexer)."""
    model_dtype: str = ""
    """What ``--kv-cache-dtype auto`` stores: the model's dtype (for the row)."""
    fp8_format: str = ""
    """The e4m3 flavour of an fp8 cache where it is not OCP e4m3fn (gfx942:
    e4m3fnuz), so the plan says which bytes the pool holds."""
    drafter: str = ""
    """The MTP drafter's caches in the target's pool ("" without a drafter)."""
    pipeline_stages: list[dict[str, Any]] = field(default_factory=list)
    """Each pipeline stage's part of the pool (PP > 1): its layers, the main
    cache dtypes they store, and how many hold an index cache."""
    stock_starts: bool = True
    """False where stock vLLM 0.33 refuses this command: there is no stock
    pool to compare capacity with."""
    precision_kinds: list[str] = field(default_factory=list)
    """Stock's own build: each (dtype, quantization mode) its specs hold,
    vLLM's measure of a mixed pool (plugin off only)."""

    def render(self) -> str:
        rows = [("plugin", self.plugin)] if self.plugin != "on" else []
        if self.model_note:
            rows.append(("model", self.model_note))
        rows += [
            ("architecture", self.architecture),
            ("target", self.target),
            ("main KV dtype", self._main_row()),
            ("indexer dtype", self._indexer_row()),
        ]
        if self.drafter:
            rows.append(("MTP drafter", self.drafter))
        if len({_pool_of(stage) for stage in self.pipeline_stages}) > 1:
            # Stages hold different pools: each one's, not the first's alone.
            rows += [
                (
                    f"PP stage {stage['stage']} of {len(self.pipeline_stages)}",
                    _stage(stage),
                )
                for stage in self.pipeline_stages
            ]
        rows += [
            ("uniform precision", self._uniform_row()),
            ("KV block zeroer", self.kv_block_zeroer),
            (
                f"bytes/token @TP{self.tensor_parallel_size}",
                f"main {self.bytes_per_token_main:,} + indexer "
                f"{self.bytes_per_token_indexer:,} = {self.bytes_per_token_total:,}",
            ),
            ("token capacity vs stock", self._capacity_row()),
        ]
        if self.executor_note:
            rows.append(("executor backend", self.executor_note))
        if self.not_judged:
            rows.append(("not judged", self.not_judged))
        return aligned(rows)

    def _uniform_row(self) -> str:
        if self.uniform_precision:
            return "yes"
        if len(self.precision_kinds) > 1:
            # fp8 beside fp8 can be two kinds to vLLM: say which two.
            kinds = ", ".join(self.precision_kinds)
            return f"no: vLLM 0.33 counts {len(self.precision_kinds)} kinds ({kinds})"
        return "no"

    def _capacity_row(self) -> str:
        if not self.stock_starts:
            return "none: stock vLLM 0.33 cannot start the command as typed"
        return (
            f"{self.token_capacity_vs_stock:.2f}x (stock vLLM 0.33 running "
            f"the command as typed: {self.stock_bytes_per_token_total:,} bytes/token)"
        )

    def _main_row(self) -> str:
        if self.kv_cache_dtype == "auto" and self.model_dtype:
            # Say what "auto" stores: bf16 for MiniMax-M3's bf16 weights.
            stored = {"bfloat16": "bf16"}.get(self.model_dtype, self.model_dtype)
            return f"{stored} (auto: the model's dtype)"
        said = [
            self.fp8_format if self.kv_cache_dtype in FP8_E4M3_DTYPES else "",
            ""
            if self.kv_cache_dtype_source == "--kv-cache-dtype"
            else self.kv_cache_dtype_source,
        ]
        said = [part for part in said if part]
        return self.kv_cache_dtype + (f" ({'; '.join(said)})" if said else "")

    def _indexer_row(self) -> str:
        said = [
            self.fp8_format if self.indexer_kv_dtype in FP8_E4M3_DTYPES else "",
            "inherited from the KV cache" if self.indexer_inherited else "",
            self.fp8_indexer,
        ]
        said = [part for part in said if part]
        return self.indexer_kv_dtype + (f" ({'; '.join(said)})" if said else "")

    @property
    def exit_code(self) -> int:
        if self.outcome is Outcome.ERROR:
            return EXIT_REFUSED
        return EXIT_MIXED if self.outcome is Outcome.MIXED else EXIT_OK


def _pool_of(stage: dict[str, Any]) -> tuple[tuple[str, ...], bool]:
    return tuple(stage["main"]), stage["index_cache_layers"] > 0


def _stage(stage: dict[str, Any]) -> str:
    first, last = stage["layers"]
    index = (
        f"index cache {stage['indexer_kv_dtype']} on {stage['index_cache_layers']} "
        "layers"
        if stage["index_cache_layers"]
        else "no index cache"
    )
    return f"layers {first}-{last}: main {' + '.join(stage['main'])}; {index}"
