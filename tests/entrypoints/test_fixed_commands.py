"""Every fix of a refusal as the user's whole command, run back through check.

A fix pasted alone does not run (``VAR=1  # ...`` sets an unexported shell
variable; ``--kv-cache-dtype auto  # ...`` is "command not found"; a dotted
``--speculative-config.kv_cache_dtype`` beside a JSON ``--speculative-config``
is refused by vLLM). ``check`` prints each fix applied to the command it
judged; here each such command, split as bash splits it, is judged again and
must start.
"""

from __future__ import annotations

import json
import shlex

import pytest

from tests.entrypoints.test_check import AITER_ON, run_checks
from vllm_minimax_m3_kv.entrypoints.check.batch import split_command
from vllm_minimax_m3_kv.entrypoints.check.fixed_commands import apply_fix, fixed_command

MTP_AUTO = '{"method":"mtp","num_speculative_tokens":1,"kv_cache_dtype":"auto"}'
FP8_TP8 = ["--kv-cache-dtype", "fp8", "-tp", "8"]
BF16_INDEXER = ["--attention-config.indexer_kv_dtype", "bf16"]

# Refusals across the policy's kinds of fix: a flag to flip, AITER variables,
# the bf16 fallback, a JSON config group, the drafter's own cache, a list flag
# to drop, a variable the user set to change, a model dtype, and the opt-in.
REFUSALS = {
    "indexer_cp": (
        [
            "--target",
            "mi355x",
            *FP8_TP8,
            "--attention-config.minimax_m3_indexer_cp",
            "true",
        ],
        {},
    ),
    "explicit_bf16_json": (
        [
            "--target",
            "mi355x",
            *FP8_TP8,
            "--attention-config",
            '{"indexer_kv_dtype": "bf16"}',
        ],
        {},
    ),
    "drafter_json": (
        ["--target", "b300", *FP8_TP8, "--speculative-config", MTP_AUTO],
        {},
    ),
    "skip_layers": (
        ["--target", "mi355x", *FP8_TP8, "--kv-cache-dtype-skip-layers", "0"],
        AITER_ON,
    ),
    # AITER sparse PA at four KV heads per rank runs only the fp8 indexer:
    # the bf16 fixes turn the shuffled layout off, over the user's own =1.
    "aiter_tp1_bf16": (
        ["--target", "mi355x", "--kv-cache-dtype", "fp8", *BF16_INDEXER],
        AITER_ON,
    ),
    # Both caches bf16, which vLLM itself cannot build here (check says so).
    "bf16_aiter_tp2": (["--target", "mi355x", "-tp", "2"], AITER_ON),
    "gfx90a": (["--target", "mi250x", "--kv-cache-dtype", "fp8", "-tp", "8"], {}),
    "float16": (
        [
            "--target",
            "mi355x",
            "--kv-cache-dtype",
            "auto",
            "--dtype",
            "float16",
            "--attention-config.indexer_kv_dtype",
            "fp8",
        ],
        {},
    ),
    "e5m2": (["--target", "h200", "--kv-cache-dtype", "fp8_e5m2", "-tp", "8"], {}),
}


def test_a_fix_replaces_values_in_every_spelling_and_edits_json():
    fix = {
        "flags": [
            ["--kv-cache-dtype", "auto"],
            ["--speculative-config.kv_cache_dtype", "auto"],
            ["--attention-config.indexer_kv_dtype", "fp8"],
        ],
        "remove": ["--kv-cache-dtype-skip-layers"],
    }
    argv = [
        "M",
        "--kv_cache_dtype=fp8",
        "--speculative-config",
        '{"method": "mtp", "kv_cache_dtype": "fp8"}',
        "--kv-cache-dtype-skip-layers",
        "0",
        "1",
        "-tp",
        "8",
    ]
    fixed = apply_fix(argv, fix, arity=lambda flag: None if "skip" in flag else 1)
    assert fixed == [
        "M",
        "--kv-cache-dtype",
        "auto",
        "--speculative-config",
        '{"method":"mtp","kv_cache_dtype":"auto"}',
        "-tp",
        "8",
        "--attention-config.indexer_kv_dtype",
        "fp8",
    ]
    line = fixed_command(argv[:1], {"A": "0"}, {"summary": "s", "env": {"A": "1"}})
    assert line == "A=1 vllm serve M  # s"


@pytest.fixture(scope="module")
def refusals() -> dict[str, dict]:
    names = list(REFUSALS)
    results = run_checks(
        [{"argv": argv, "env": env} for argv, env in REFUSALS.values()]
    )
    return dict(zip(names, results, strict=True))


def test_every_refusal_prints_whole_commands(refusals):
    for name, result in refusals.items():
        assert result["exit"] == 2, (name, result)
        fixes = result["plan"]["fixes"]
        assert fixes and all(fix["command"] for fix in fixes), name
        for fix in fixes:
            words = shlex.split(fix["command"], comments=True)
            assert "vllm" in words and words[words.index("vllm") + 1] == "serve"
    drafter = refusals["drafter_json"]["plan"]["fixes"]
    # The drafter's dtype is set inside the JSON the user gave, not beside it.
    for fix in drafter:
        assert "--speculative-config.kv_cache_dtype" not in fix["command"], fix


def test_every_printed_command_starts_when_run_as_printed(refusals):
    cases, sources = [], []
    for name, result in refusals.items():
        target = REFUSALS[name][0][REFUSALS[name][0].index("--target") + 1]
        for fix in result["plan"]["fixes"]:
            env, argv = split_command(fix["command"])
            cases.append({"argv": ["--target", target, *argv], "env": env})
            sources.append((name, fix["command"]))
    rerun = run_checks(cases)
    refused = [
        (
            source,
            result["exit"],
            (result["plan"] or {}).get("message", result["stderr"]),
        )
        for source, result in zip(sources, rerun, strict=True)
        if result["exit"] not in (0, 3)  # starts: uniform, or mixed by opt-in
    ]
    assert refused == [], json.dumps(refused, indent=1)
