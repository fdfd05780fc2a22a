"""The recorded decision: what the hook writes into ``additional_config``,
read back as it was, never written into a dict another config shares."""

from __future__ import annotations

import json
from types import SimpleNamespace

from tests.config.test_indexer_precision import MI300X_NO_SPA, facts
from vllm_minimax_m3_kv.config.indexer_precision import decide
from vllm_minimax_m3_kv.config.recorded_verdict import (
    record_verdict,
    recorded_verdict,
)
from vllm_minimax_m3_kv.config.verdicts import Outcome

MI300X_FP8 = facts(MI300X_NO_SPA)
"""MI300X, AITER sparse PA off: the fp8 index cache is inherited, in fnuz."""


def test_the_record_reads_back_as_decided_and_leaves_the_shared_dict_alone():
    shared = {"gdn_prefill_backend": "auto"}
    base = SimpleNamespace(additional_config=shared)
    verdict = decide(MI300X_FP8)
    assert record_verdict(base, MI300X_FP8, verdict)
    # A config made by replace() shares the base's dict until its hook runs.
    drafter = SimpleNamespace(additional_config=shared)
    assert shared == {"gdn_prefill_backend": "auto"}
    assert recorded_verdict(drafter) is None
    recorded = recorded_verdict(base)
    assert recorded is not None
    assert recorded.outcome is verdict.outcome is Outcome.INHERITED
    assert recorded.fp8_format == "e4m3fnuz"
    assert recorded.fp8_dtype_name == "float8_e4m3fnuz"
    assert recorded.fp8_main_cache
    assert base.additional_config["gdn_prefill_backend"] == "auto"
    # vLLM hashes additional_config as JSON.
    assert json.loads(json.dumps(base.additional_config)) == base.additional_config


def test_a_non_dict_additional_config_is_not_recorded_into():
    opaque = SimpleNamespace(additional_config=object())
    assert not record_verdict(opaque, MI300X_FP8, decide(MI300X_FP8))
    assert recorded_verdict(opaque) is None
    assert recorded_verdict(None) is None
