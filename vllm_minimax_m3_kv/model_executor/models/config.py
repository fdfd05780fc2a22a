"""MiniMax-M3 per-architecture config hook (vLLM's ``MODELS_CONFIG_MAP``).

Runs once per engine, in ``VllmConfig.__post_init__``, before any worker
exists: the resolved ``indexer_kv_dtype`` then reaches every TP/PP worker with
the config. vLLM's own MiniMax-M3 hook (if any) runs first, unchanged.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from vllm_minimax_m3_kv.config.facts import live_facts
from vllm_minimax_m3_kv.config.indexer_precision import decide
from vllm_minimax_m3_kv.config.pool_facts import PrecisionFacts
from vllm_minimax_m3_kv.config.recorded_verdict import record_verdict
from vllm_minimax_m3_kv.config.targets import record_judgement
from vllm_minimax_m3_kv.config.verdicts import Outcome, Verdict

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.model_executor.models.config import VerifyAndUpdateConfig


class IndexerPrecisionError(ValueError):
    """A MiniMax-M3 KV precision mismatch no default can resolve."""

    def __init__(self, verdict: Verdict, fixed_commands: Sequence[str] = ()) -> None:
        from vllm_minimax_m3_kv.verdict_text import refusal_text

        super().__init__(refusal_text(verdict.message, fixed_commands))
        self.verdict = verdict
        self.fixed_commands = tuple(fixed_commands)


def apply_indexer_precision(vllm_config: VllmConfig) -> None:
    """Resolve ``auto`` to fp8 where it makes the pool uniform, else raise."""
    from vllm_minimax_m3_kv._log import get_logger, log_pending_info

    log_pending_info()  # register()'s line, now that vLLM logs
    if vllm_config.model_config is None:
        return
    facts = live_facts(vllm_config)
    verdict = decide(facts)
    record_judgement(facts, verdict)
    logger = get_logger(__name__)
    for note in verdict.notes:
        logger.warning_once(note)
    if verdict.outcome is Outcome.ERROR:
        # Under `vllm serve`, each fix also as the whole command, as it runs.
        from vllm_minimax_m3_kv.verdict_text import fixed_serve_commands

        raise IndexerPrecisionError(verdict, fixed_serve_commands(verdict.fixes))
    resolve_kv_cache_dtype_before_model_build(vllm_config, facts)
    # What runs after this (model build, KV planning) reads the decision.
    if not record_verdict(vllm_config, facts, verdict):
        logger.warning_once(
            "MiniMax-M3 KV precision: additional_config is not a dict, so the "
            "decision cannot be recorded for model build; the index cache "
            "keeps vLLM's own description (a mixed pool with an fp8 main "
            "cache). Pass additional_config as a dict (--additional-config "
            "takes a JSON object)."
        )
    if verdict.outcome is Outcome.MIXED:
        # The zeroing patch (patches.py) makes every worker and the scheduler
        # honour the zeroer this pool needs.
        logger.warning_once("MiniMax-M3 %s.", verdict.reason)
    # decide() resolves only `auto` (INHERITED, or MIXED beside skipped layers).
    if verdict.indexer_kv_dtype != facts.indexer_kv_dtype:
        vllm_config.attention_config.indexer_kv_dtype = verdict.indexer_kv_dtype
        logger.info_once(
            "MiniMax-M3 indexer_kv_dtype=%s (%s).",
            verdict.indexer_kv_dtype,
            verdict.reason
            if verdict.outcome is Outcome.INHERITED
            else f"inherited from the {facts.kv_cache_dtype} KV cache",
        )


def resolve_kv_cache_dtype_before_model_build(
    vllm_config: VllmConfig, facts: PrecisionFacts
) -> None:
    """Give ``cache_config`` the main KV dtype the checkpoint declares.

    vLLM applies a compressed-tensors ``kv_cache_scheme`` only in
    ``Attention.__init__``, at model build: sparse layers built before the
    first dense layer, and pipeline stages without one, would keep the model
    dtype, and the engine core (which builds no model) would plan with
    ``auto``. Resolved here, every layer, worker and the planner read the one
    dtype the decision was made on. Only ``auto`` is resolved, and only where
    vLLM's ``Attention`` would resolve it.
    """
    from vllm_minimax_m3_kv._log import get_logger

    cache_config = vllm_config.cache_config
    if facts.kv_cache_dtype == cache_config.cache_dtype:
        return
    cache_config.cache_dtype = facts.kv_cache_dtype
    get_logger(__name__).info_once(
        "MiniMax-M3 kv_cache_dtype=%s, from the checkpoint's %s: resolved "
        "before model build (vLLM's Attention applies it there), so that every "
        "layer and pipeline stage stores it.",
        facts.kv_cache_dtype,
        facts.kv_cache_source,
    )


def make_config_hook(
    stock: type[VerifyAndUpdateConfig] | None,
) -> type[VerifyAndUpdateConfig]:
    """A hook class that runs vLLM's own entry (if any), then ours."""
    from vllm.model_executor.models.config import VerifyAndUpdateConfig

    base = stock or VerifyAndUpdateConfig

    class MiniMaxM3IndexerPrecisionConfig(base):  # type: ignore[valid-type,misc]
        stock_hook = stock

        @staticmethod
        def verify_and_update_config(vllm_config: VllmConfig) -> None:
            base.verify_and_update_config(vllm_config)
            apply_indexer_precision(vllm_config)

    return MiniMaxM3IndexerPrecisionConfig
