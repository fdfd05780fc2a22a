"""One output sink: each command's answer as text, one JSON object, or
nothing (the exit code), and its problems on stderr in every mode."""

from __future__ import annotations

import json

import pytest

from vllm_minimax_m3_kv.entrypoints import status
from vllm_minimax_m3_kv.entrypoints.output import Mode, Output

LEFT_OUT = "lora_filesystem_resolver"
"""A VLLM_PLUGINS value without this plugin: status answers 1 and, as vLLM
would not load the plugin, never imports vLLM."""


@pytest.fixture
def plugin_left_out(monkeypatch):
    monkeypatch.setenv("VLLM_PLUGINS", LEFT_OUT)


def test_status_json_is_one_object_with_every_row_and_the_exit(plugin_left_out, capsys):
    assert status.main(["--json"]) == 1
    printed = capsys.readouterr()
    answer = json.loads(printed.out)
    assert answer["exit"] == 1
    assert "leaves out minimax_m3_kv" in answer["report"]["VLLM_PLUGINS"]
    assert answer["report"]["register()"].startswith("not reached")
    assert printed.err == ""


def test_status_text_and_json_carry_the_same_rows(plugin_left_out, capsys):
    status.main([])
    text = capsys.readouterr().out
    status.main(["--json"])
    report = json.loads(capsys.readouterr().out)["report"]
    for name, value in report.items():
        assert f"{name}" in text and value in text


def test_status_quiet_prints_nothing_and_answers_by_exit_code(plugin_left_out, capsys):
    assert status.main(["--quiet"]) == 1
    assert capsys.readouterr() == ("", "")


def test_selftest_json_without_a_gpu_says_it_did_not_run(monkeypatch, capsys):
    from vllm_minimax_m3_kv.entrypoints import selftest

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    assert selftest.main(["--json"]) == selftest.EXIT_NOT_RUN
    answer = json.loads(capsys.readouterr().out)
    # One schema in every answer (docs/deploying.md lists its keys).
    assert answer == {
        "schema": 1,
        "exit": selftest.EXIT_NOT_RUN,
        "ran": False,
        "passed": None,
        "verdict": None,
        "failures": [],
        "why": "not run: no GPU in this process",
        "replay_file": None,
        "replay": None,
    }


def test_a_problem_reaches_stderr_in_every_mode(capsys):
    for mode in Mode:
        Output(mode).problem("vllm-minimax-m3-kv: refused")
        Output(mode).answer("the plan", {"plan": 1})
        printed = capsys.readouterr()
        assert printed.err == "vllm-minimax-m3-kv: refused\n"
        assert (
            printed.out
            == {
                Mode.HUMAN: "the plan\n",
                Mode.JSON: '{\n  "plan": 1\n}\n',
                Mode.QUIET: "",
            }[mode]
        )
