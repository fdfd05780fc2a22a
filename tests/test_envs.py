"""The plugin's switches read one way, as vLLM's boolean variables do."""

from __future__ import annotations

import pytest

from vllm_minimax_m3_kv import envs

SWITCHES = {
    envs.ALLOW_MIXED_ENV: envs.allow_mixed_from_env,
    envs.SKIP_SELFTEST_ENV: envs.skip_selftest_from_env,
    envs.FP8_BALANCED_DECODE_ENV: envs.fp8_balanced_decode_from_env,
}


@pytest.mark.parametrize("name", SWITCHES)
@pytest.mark.parametrize(
    ("value", "on"),
    [
        ("1", True),
        ("true", True),
        ("True", True),
        (" yes ", True),
        ("on", True),
        ("0", False),
        ("false", False),
        ("FALSE", False),
        ("no", False),
        ("off", False),
        ("", False),
        (None, False),
    ],
)
def test_every_switch_reads_on_and_off_the_same_way(monkeypatch, name, value, on):
    if value is None:
        monkeypatch.delenv(name, raising=False)
    else:
        monkeypatch.setenv(name, value)
    assert SWITCHES[name]() is on


@pytest.mark.parametrize("name", SWITCHES)
@pytest.mark.parametrize("value", ["2", "ture", "enable", "-1"])
def test_anything_else_is_an_error_that_names_the_switch(monkeypatch, name, value):
    monkeypatch.setenv(name, value)
    with pytest.raises(ValueError) as error:
        SWITCHES[name]()
    message = str(error.value)
    assert f"{name}={value!r}" in message
    assert f"{name}=1 to turn it on, {name}=0 to turn it off" in message
