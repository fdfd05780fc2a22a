"""The node self-test's kept verdict: only a passed verdict this code wrote,
of this schema, for this exact key, spares a worker the kernels; anything
else at its path is named in one warning and the self-test runs.

In-process (no platform, no kernels); what keys a verdict (the balanced-decode
opt-in, the code hash) is checked where the gate runs, in
``test_rocm_fp8_triton_indexer.py``.
"""

from __future__ import annotations

import json
import logging
import os

import pytest

from vllm_minimax_m3_kv import selftest_gate
from vllm_minimax_m3_kv.selftest import Result

KEY = {"host": "node-1", "gpu": "AMD Instinct MI355X", "fp8": "float8_e4m3fn"}


@pytest.fixture
def warnings():
    """The gate's warnings, as vLLM's logger tree receives them."""
    seen: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(record.getMessage())

    logger = logging.getLogger(f"vllm.{selftest_gate.__name__}")
    handler = Keep(level=logging.WARNING)
    logger.addHandler(handler)
    yield seen
    logger.removeHandler(handler)


def _passed() -> Result:
    return Result(checked=184, record={"score_error": 0.09}, writer="writer: x")


def test_a_verdict_this_code_wrote_is_read_back(tmp_path, warnings):
    path = tmp_path / "v.json"
    selftest_gate.store_result(path, KEY, _passed())
    kept = selftest_gate.cached_result(path, KEY)
    assert kept is not None and kept.passed and kept.record["cached"] == str(path)
    assert kept.checked == 184 and kept.writer == "writer: x"
    assert warnings == []
    # Another key (another node, code or setting) is not this verdict.
    assert selftest_gate.cached_result(path, {**KEY, "code": "edited"}) is None


def _written(path, **changes) -> None:
    entry = {
        "schema": selftest_gate.VERDICT_SCHEMA,
        "verdict": "passed",
        "key": KEY,
        "checked": 184,
        "writer": "writer: x",
        "score_error": 0.09,
        **changes,
    }
    path.write_text(json.dumps({k: v for k, v in entry.items() if v is not ...}))


@pytest.mark.parametrize(
    ("changes", "why"),
    [
        ({"verdict": "failed"}, "says verdict 'failed', not 'passed'"),
        ({"schema": 99}, "has schema 99, not 2"),
        ({"schema": ...}, "has schema None, not 2"),
        ({"checked": 0}, "has checks 0"),
        ({"checked": ...}, "has checks None"),
        ({"score_error": float("nan")}, "has score error nan"),
        ({"score_error": 3.5}, "has score error 3.5"),
        ({"writer": ...}, "names no writer verdict"),
    ],
)
def test_a_file_that_is_not_a_passed_verdict_is_ignored_by_name(
    tmp_path, warnings, changes, why
):
    path = tmp_path / "v.json"
    _written(path, **changes)
    assert selftest_gate.cached_result(path, KEY) is None
    assert len(warnings) == 1
    assert f"ignoring {path}: it {why}" in warnings[0], warnings
    assert "running the self-test instead" in warnings[0]


def test_a_passed_false_file_of_the_old_schema_is_not_a_pass(tmp_path, warnings):
    # What the issue found started from: {"passed": false} at the path.
    path = tmp_path / "v.json"
    path.write_text(
        json.dumps({"key": KEY, "passed": False, "checked": 1, "writer": ""})
    )
    assert selftest_gate.cached_result(path, KEY) is None
    assert "has schema None" in warnings[0]


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("[]", "holds a JSON list"),
        ("null", "holds a JSON NoneType"),
        ("{", "is not JSON"),
    ],
)
def test_wrong_shaped_json_names_the_file(tmp_path, warnings, text, why):
    path = tmp_path / "v.json"
    path.write_text(text)
    assert selftest_gate.cached_result(path, KEY) is None
    assert f"ignoring {path}: it {why}" in warnings[0]


def test_no_file_is_no_verdict_and_no_warning(tmp_path, warnings):
    assert selftest_gate.cached_result(tmp_path / "none.json", KEY) is None
    assert warnings == []


def test_an_empty_cache_root_means_vllms_default(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.setenv("VLLM_CACHE_ROOT", "")
    path = selftest_gate.verdict_path(KEY)
    assert path.is_absolute()
    assert str(path).startswith(os.path.join(str(tmp_path / "xdg"), "vllm", ""))
    monkeypatch.setenv("VLLM_CACHE_ROOT", str(tmp_path / "root"))
    assert str(selftest_gate.verdict_path(KEY)).startswith(str(tmp_path / "root"))
