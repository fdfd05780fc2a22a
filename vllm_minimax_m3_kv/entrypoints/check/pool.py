"""From the decision's facts and verdict to a :class:`~.plan.Plan`: the
pool the plugin builds (or stock vLLM 0.33 where ``VLLM_PLUGINS`` leaves it
out), its bytes per token against stock running the command as typed, and
each fix's."""

from __future__ import annotations

import os
import shlex
from dataclasses import replace
from typing import Any

from vllm_minimax_m3_kv._versions import PLUGIN_ENTRY_POINT
from vllm_minimax_m3_kv.config.facts import target_platform_facts
from vllm_minimax_m3_kv.config.indexer_precision import decide
from vllm_minimax_m3_kv.config.pool_facts import STOCK_INDEXER_DEFAULT, PrecisionFacts
from vllm_minimax_m3_kv.config.targets import HERE
from vllm_minimax_m3_kv.config.verdicts import Fix, Outcome, Verdict, facts_with_fix
from vllm_minimax_m3_kv.entrypoints.check.early import versions_line
from vllm_minimax_m3_kv.entrypoints.check.plan import Plan
from vllm_minimax_m3_kv.entrypoints.check.stock_build import StockBuild
from vllm_minimax_m3_kv.entrypoints.check.stock_vllm import (
    bf16_pool_vllm_cannot_build,
    stock_cannot_start,
)
from vllm_minimax_m3_kv.envs import ALLOW_MIXED_ENV
from vllm_minimax_m3_kv.verdict_text import fix_edits

ZEROER_NOT_BUILT = "not built"


ZEROER_HONOURED = (
    f"built and honoured on every worker and the scheduler ({ALLOW_MIXED_ENV}=1)"
)


ZEROER_REFUSED = "none: this configuration is refused at startup"


ZEROER_STOCK = (
    "built on every worker; the scheduler never asks it to zero (stock vLLM 0.33)"
)


def fp8_format_of(facts: PrecisionFacts) -> str:
    fp8_format = facts.platform.fp8_e4m3_format
    return "" if fp8_format == "e4m3fn" else fp8_format


def _stored(kv_cache_dtype: str, model_dtype: str) -> str:
    """What a main cache of this dtype stores (``auto``: the model's dtype)."""
    return model_dtype if kv_cache_dtype == "auto" else kv_cache_dtype


def drafter_caches(facts: PrecisionFacts, indexer: str) -> str:
    """The MTP drafter's caches, which join the target's block pool."""
    draft = facts.draft_kv_cache_dtype
    if draft is None and not facts.layers.drafter_index_cache:
        return ""
    if draft is None:
        main = f"{_stored(facts.kv_cache_dtype, facts.model_dtype)} (the target's)"
    else:
        main = (
            f"{_stored(draft, facts.model_dtype)} (speculative_config.kv_cache_dtype"
            f"{' auto: the model dtype' if draft == 'auto' else ''})"
        )
    index = (
        f", index cache {indexer} (the target's indexer)"
        if facts.layers.drafter_index_cache
        else ""
    )
    return f"main KV {main}{index}"


def pipeline_stages(facts: PrecisionFacts, indexer: str) -> list[dict[str, Any]]:
    """Each pipeline stage's part of the pool, as vLLM splits the layers."""
    layers = facts.layers
    if len(layers.pp_stage_starts) < 2:
        return []
    ends = (*layers.pp_stage_starts[1:], layers.num_layers)
    unquantized = set(facts.unquantized_dense_layers)
    main = _stored(facts.kv_cache_dtype, facts.model_dtype)
    stages = []
    for stage, (first, end) in enumerate(
        zip(layers.pp_stage_starts, ends, strict=True)
    ):
        ids = range(first, end)
        stages.append(
            {
                "stage": stage,
                "layers": [first, end - 1],
                "main": sorted(
                    {facts.model_dtype if i in unquantized else main for i in ids}
                ),
                "index_cache_layers": sum(1 for i in ids if i in layers.sparse),
                "indexer_kv_dtype": indexer,
            }
        )
    return stages


def target_row(target: str, facts: PrecisionFacts) -> str:
    name = facts.platform.name if target == HERE else target_platform_facts(target).name
    if target == HERE and facts.platform.vendor == "rocm":
        aiter = (
            "aiter with the MSA kernels"
            if facts.platform.aiter_msa_kernels
            else "aiter without the MSA kernels"
            if facts.platform.aiter_installed
            else "no aiter"
        )
        name = f"{name}, {aiter}"
    return f"{target} ({name})"


def kv_source(facts: PrecisionFacts) -> str:
    if not facts.kv_from_checkpoint:
        return "--kv-cache-dtype"
    return f"from the checkpoint's {facts.kv_cache_source}"


def _stock_kv_source(facts: PrecisionFacts) -> str:
    # Stock vLLM applies a compressed-tensors declaration only at model build
    # (Attention.__init__), and only to the layers built after a dense one.
    source = kv_source(facts)
    if facts.kv_from_checkpoint and facts.kv_cache_flag == "auto":
        return f"{source}, applied by stock vLLM only at model build"
    return source


def stock_plan(
    model_config: Any,
    facts: PrecisionFacts,
    verdict: Verdict,
    stock: StockBuild,
    target: str,
    executor_note: str,
) -> Plan:
    """What ``vllm serve`` runs with this plugin left out by VLLM_PLUGINS:
    stock vLLM's own build (:mod:`.stock_build`) answers; ``verdict`` (the
    plugin's) only says whether turning the plugin on is a fix."""
    from vllm_minimax_m3_kv.entrypoints.check.kv_bytes import kv_bytes_per_token

    listed = os.environ.get("VLLM_PLUGINS", "")
    off = f"vllm-minimax-m3-kv is off (VLLM_PLUGINS={shlex.quote(listed)})"
    common: dict[str, Any] = {
        "architecture": model_config.architecture,
        "target": target_row(target, facts),
        "kv_cache_dtype": facts.kv_cache_dtype,
        "indexer_inherited": False,
        "tensor_parallel_size": facts.tensor_parallel_size,
        "versions": versions_line(),
        "kv_cache_dtype_source": _stock_kv_source(facts),
        "plugin": f"off: VLLM_PLUGINS leaves out {PLUGIN_ENTRY_POINT}; this is "
        "stock vLLM 0.33's plan",
        "executor_note": executor_note,
        "fp8_format": fp8_format_of(facts),
        "model_dtype": facts.model_dtype,
        "notes": [],
    }
    if stock.refused:
        asked = facts.indexer_kv_dtype
        indexer = STOCK_INDEXER_DEFAULT if asked == "auto" else asked
        sizes = kv_bytes_per_token(
            model_config=model_config,
            kv_cache_dtype=facts.kv_cache_dtype,
            tensor_parallel_size=facts.tensor_parallel_size,
            unquantized_layers=len(facts.unquantized_dense_layers),
            indexer_kv_dtype=indexer,
        )
        where = target_row(target, facts)
        message = (
            f"stock vLLM 0.33 cannot start this command on {where}: its "
            f"{stock.refused_at} refuses it ({stock.refused}); {off}"
        )
        fixes = []
        ours = plugin_plan(model_config, facts, verdict, target)
        if ours.outcome is not Outcome.ERROR:
            names = [name for name in listed.split(",") if name]
            fixes.append(
                Fix(
                    f"vllm-minimax-m3-kv on: {ours.headline}",
                    env=(("VLLM_PLUGINS", ",".join([*names, PLUGIN_ENTRY_POINT])),),
                )
            )
        return Plan(
            **common,
            indexer_kv_dtype=indexer,
            uniform_precision=False,
            kv_block_zeroer=ZEROER_REFUSED,
            bytes_per_token_main=sizes.main,
            bytes_per_token_indexer=sizes.indexer,
            bytes_per_token_total=sizes.total,
            stock_bytes_per_token_total=0,
            token_capacity_vs_stock=0.0,
            stock_starts=False,
            outcome=Outcome.ERROR,
            message=message + "".join(f"\n  {fix.render()}" for fix in fixes),
            headline=message,
            fixes=[fix_edits(fix) for fix in fixes],
            drafter=drafter_caches(facts, indexer),
            pipeline_stages=pipeline_stages(facts, indexer),
        )
    indexer = stock.indexer_kv_dtype
    uniform = len(stock.kinds) == 1
    message = f"stock vLLM 0.33 runs a mixed KV pool here: {off}"
    total = stock.main_bytes + stock.indexer_bytes
    return Plan(
        **common,
        indexer_kv_dtype=indexer,
        uniform_precision=uniform,
        precision_kinds=list(stock.kinds),
        kv_block_zeroer=_stock_zeroer(stock),
        bytes_per_token_main=stock.main_bytes,
        bytes_per_token_indexer=stock.indexer_bytes,
        bytes_per_token_total=total,
        stock_bytes_per_token_total=total,
        token_capacity_vs_stock=1.0,
        outcome=Outcome.UNCHANGED if uniform else Outcome.MIXED,
        message=message,
        headline=message,
        drafter=drafter_caches(facts, indexer),
        pipeline_stages=pipeline_stages(facts, indexer),
    )


def _stock_zeroer(stock: StockBuild) -> str:
    """Who builds a zeroer in stock's pool, and whether the scheduler asks it."""
    if not stock.mixed:
        return ZEROER_NOT_BUILT
    if stock.scheduler_zeroes:
        return "built on every worker; the scheduler asks it to zero new blocks"
    if all(stock.workers_zero):
        return ZEROER_STOCK
    stages = [str(i) for i, zeroes in enumerate(stock.workers_zero) if zeroes]
    return (
        f"built on PP stage {', '.join(stages)} only; the scheduler never asks "
        "it to zero (stock vLLM 0.33)"
    )


def plugin_plan(
    model_config: Any,
    facts: PrecisionFacts,
    verdict: Verdict,
    target: str,
    executor_note: str = "",
) -> Plan:
    """What ``vllm serve`` builds with the plugin: the verdict's pool, its
    bytes, and each fix's capacity, all against stock vLLM 0.33 running the
    command as typed."""
    from vllm_minimax_m3_kv.entrypoints.check.kv_bytes import kv_bytes_per_token

    # The plugin leaves bf16 pools to vLLM; check still says when vLLM will
    # fail to build one, since it promises what `vllm serve` does.
    unbuildable = (
        bf16_pool_vllm_cannot_build(facts)
        if verdict.outcome is Outcome.UNCHANGED
        else None
    )
    verdict = unbuildable or verdict
    resolved = verdict.indexer_kv_dtype
    tp = facts.tensor_parallel_size
    sizes = {
        "model_config": model_config,
        "kv_cache_dtype": facts.kv_cache_dtype,
        "tensor_parallel_size": tp,
        "unquantized_layers": len(facts.unquantized_dense_layers),
    }
    shown_indexer = resolved if resolved != "auto" else STOCK_INDEXER_DEFAULT
    if verdict.outcome is Outcome.ERROR and facts.draft_kv_cache_dtype is not None:
        # A drafter refusal: the target's own pool is what the plan shows.
        own = decide(replace(facts, draft_kv_cache_dtype=None))
        if own.starts and own.indexer_kv_dtype != "auto":
            shown_indexer = own.indexer_kv_dtype
    ours = kv_bytes_per_token(**sizes, indexer_kv_dtype=shown_indexer)
    requested = facts.indexer_kv_dtype
    stock = kv_bytes_per_token(
        **sizes,
        indexer_kv_dtype=STOCK_INDEXER_DEFAULT if requested == "auto" else requested,
    )

    def capacity(fix: Fix) -> float:
        """KV tokens with ``fix`` applied, against stock running this command."""
        after = facts_with_fix(facts, fix)
        indexer = decide(after).indexer_kv_dtype
        with_fix = kv_bytes_per_token(
            model_config=model_config,
            kv_cache_dtype=after.kv_cache_dtype,
            tensor_parallel_size=after.tensor_parallel_size,
            unquantized_layers=len(after.unquantized_dense_layers),
            indexer_kv_dtype=STOCK_INDEXER_DEFAULT if indexer == "auto" else indexer,
        )
        return round(stock.total / with_fix.total, 4)

    # Capacity is compared only with a pool stock can start.
    stock_starts = not stock_cannot_start(facts)
    # Both caches bf16 (unchanged) is uniform too, even where vLLM cannot
    # build it; only MIXED and the plugin's refusals are not.
    uniform = unbuildable is not None or verdict.outcome not in (
        Outcome.MIXED,
        Outcome.ERROR,
    )
    zeroer = {
        Outcome.ERROR: ZEROER_REFUSED,
        Outcome.MIXED: ZEROER_HONOURED,
    }.get(verdict.outcome, ZEROER_NOT_BUILT)
    return Plan(
        architecture=model_config.architecture,
        target=target_row(target, facts),
        kv_cache_dtype=facts.kv_cache_dtype,
        indexer_kv_dtype=shown_indexer,
        indexer_inherited=requested == "auto"
        and shown_indexer != STOCK_INDEXER_DEFAULT,
        uniform_precision=uniform,
        kv_block_zeroer=zeroer,
        tensor_parallel_size=tp,
        bytes_per_token_main=ours.main,
        bytes_per_token_indexer=ours.indexer,
        bytes_per_token_total=ours.total,
        stock_bytes_per_token_total=stock.total,
        token_capacity_vs_stock=round(stock.total / ours.total, 4),
        outcome=verdict.outcome,
        message=verdict.message,
        headline=verdict.headline,
        notes=list(verdict.notes),
        executor_note=executor_note,
        kv_cache_dtype_source=kv_source(facts),
        fixes=[
            {**fix_edits(fix), "token_capacity_vs_stock": capacity(fix)}
            if stock_starts
            else fix_edits(fix)
            for fix in verdict.fixes
        ],
        stock_starts=stock_starts,
        versions=versions_line(),
        fp8_indexer=verdict.fp8_indexer or "",
        fp8_format=fp8_format_of(facts),
        model_dtype=facts.model_dtype,
        drafter=drafter_caches(facts, shown_indexer),
        pipeline_stages=pipeline_stages(facts, shown_indexer),
    )
