"""The config-time decision, recorded in the engine's ``VllmConfig``.

The hook decides once, in ``VllmConfig.__post_init__``. What runs after it
(the index cache's fp8 type and description at model build, the node
self-test's fp8 format, the KV planner's checks in the engine core) reads
this record instead of reading ``cache_config`` or asking the platform
again, so nothing changed after the decision can make them disagree with it.

The record is one key of ``VllmConfig.additional_config``, the dict vLLM
keeps for per-model runtime choices (its own engine arguments put
``gdn_prefill_backend`` there): vLLM's ``replace`` and pickling (to the engine
core and workers) carry it, and it joins the config hash as JSON. Extra
attributes on a config object would not survive: vLLM's ``replace`` refuses
any instance attribute that is not a field. A config made with ``replace``
(the drafter's) runs ``__post_init__`` and so the hook again, which records
that config's own decision in a new dict. No record (the hook did not run on
this config): the later hooks leave vLLM's behaviour as it is.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from vllm_minimax_m3_kv.config.pool_facts import FP8_E4M3_DTYPES, PrecisionFacts
from vllm_minimax_m3_kv.config.verdicts import Outcome, Verdict

RECORD_KEY = "minimax_m3_kv"
"""This plugin's key in ``VllmConfig.additional_config``."""


@dataclass(frozen=True)
class RecordedVerdict:
    """What the decision made of this engine's KV pool."""

    outcome: Outcome
    kv_cache_dtype: str
    """The main cache's dtype as vLLM stores it (the checkpoint's resolved)."""
    main_cache_precision: str
    """The same, with ``auto`` named as the model dtype (for messages)."""
    indexer_kv_dtype: str
    fp8_format: str
    """``e4m3fn`` or ``e4m3fnuz``: :attr:`PlatformFacts.fp8_e4m3_format`,
    as the decision's facts read it from vLLM (``is_fp8_fnuz``)."""

    @classmethod
    def of(cls, facts: PrecisionFacts, verdict: Verdict) -> RecordedVerdict:
        return cls(
            outcome=verdict.outcome,
            kv_cache_dtype=facts.kv_cache_dtype,
            main_cache_precision=facts.main_cache_precision,
            indexer_kv_dtype=verdict.indexer_kv_dtype,
            fp8_format=facts.platform.fp8_e4m3_format,
        )

    @property
    def fp8_main_cache(self) -> bool:
        """The main cache stores fp8 e4m3 (so an fp8 index cache matches it)."""
        return self.kv_cache_dtype in FP8_E4M3_DTYPES

    @property
    def fp8_dtype_name(self) -> str:
        """The torch dtype name of the platform's fp8 e4m3."""
        return f"float8_{self.fp8_format}"

    @property
    def one_precision(self) -> str | None:
        """E.g. "one precision: main cache fp8_e4m3, index cache fp8"; None
        where the decision accepted a mixed pool."""
        if self.outcome in (Outcome.MIXED, Outcome.ERROR):
            return None
        indexer = self.indexer_kv_dtype
        return (
            f"one precision: main cache {self.main_cache_precision}, index cache "
            f"{'bf16' if indexer in ('auto', 'bf16') else indexer}"
        )


def record_verdict(vllm_config: Any, facts: PrecisionFacts, verdict: Verdict) -> bool:
    """Record the decision on ``vllm_config``; False where its
    ``additional_config`` is not a dict (a hashable object set in code)."""
    extra = vllm_config.additional_config
    if not isinstance(extra, dict):
        return False
    recorded = RecordedVerdict.of(facts, verdict)
    # A new dict: a config made by replace() shares its base's.
    vllm_config.additional_config = {
        **extra,
        RECORD_KEY: {**vars(recorded), "outcome": recorded.outcome.value},
    }
    return True


def recorded_verdict(vllm_config: Any) -> RecordedVerdict | None:
    """The decision recorded on ``vllm_config`` (None, also for no config)."""
    extra = getattr(vllm_config, "additional_config", None)
    if not isinstance(extra, dict) or RECORD_KEY not in extra:
        return None
    recorded = dict(extra[RECORD_KEY])
    return RecordedVerdict(outcome=Outcome(recorded.pop("outcome")), **recorded)
