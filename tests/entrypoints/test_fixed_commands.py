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
import re
import shlex

import pytest

from tests.entrypoints.test_check import run_checks
from vllm_minimax_m3_kv.entrypoints.check.script import split_command
from vllm_minimax_m3_kv.verdict_text import apply_fix, fixed_command
from vllm_minimax_m3_kv_sim import REPO
from vllm_minimax_m3_kv_sim.environments import AITER_SPARSE_PA

MTP_AUTO = '{"method":"mtp","num_speculative_tokens":1,"kv_cache_dtype":"auto"}'
FP8 = ["--kv-cache-dtype", "fp8"]
FP8_TP8 = [*FP8, "-tp", "8"]
BF16_INDEXER = ["--attention-config.indexer_kv_dtype", "bf16"]
FP8_INDEXER = ["--attention-config.indexer_kv_dtype", "fp8"]
INDEXER_CP = ["--attention-config.minimax_m3_indexer_cp", "true"]
DATA = "tests/data"
TINY = ["-tp", "4", "--max-model-len", "8192"]

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
        AITER_SPARSE_PA,
    ),
    # AITER sparse PA at four KV heads per rank runs only the fp8 indexer:
    # the bf16 fixes turn the shuffled layout off, over the user's own =1.
    "aiter_tp1_bf16": (
        ["--target", "mi355x", "--kv-cache-dtype", "fp8", *BF16_INDEXER],
        AITER_SPARSE_PA,
    ),
    # Both caches bf16, which vLLM itself cannot build here (check says so).
    "bf16_aiter_tp2": (["--target", "mi355x", "-tp", "2"], AITER_SPARSE_PA),
    "gfx90a": (["--target", "mi250x", "--kv-cache-dtype", "fp8", "-tp", "8"], {}),
    # AITER's kernels would write the fnuz index cache: the fix turns the
    # shuffled layout off, and the plugin's writer fills it.
    "gfx942_aiter_sparse_pa": (
        ["--target", "mi300x", "--kv-cache-dtype", "fp8", "-tp", "4"],
        AITER_SPARSE_PA,
    ),
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
    # The rest of docs/troubleshooting.md's refusals, each by a command that
    # reaches it.
    "msa_shape_tp2": (
        ["--target", "mi355x", f"{DATA}/minimax_m3_tiny_topk32", *FP8, "-tp", "2"],
        AITER_SPARSE_PA,
    ),
    "msa_top_k_tp2": (
        ["--target", "mi355x", *FP8, "-tp", "2", "--max-model-len", "2000000"],
        {**AITER_SPARSE_PA, "VLLM_ALLOW_LONG_MAX_MODEL_LEN": "1"},
    ),
    "a100": (["--target", "a100", *FP8_TP8, *FP8_INDEXER], {}),
    "cuda_indexer_cp": (["--target", "b300", *FP8_TP8, *INDEXER_CP], {}),
    "fp8_indexer_bf16_main": (["--target", "b300", *FP8_INDEXER, "-tp", "8"], {}),
    "mxfp4_indexer": (
        ["--target", "b300", *FP8_TP8, "--attention-config.indexer_kv_dtype", "mxfp4"],
        {},
    ),
    "checkpoint_fp8_bf16_indexer": (
        ["--target", "b300", f"{DATA}/minimax_m3_tiny_ct_fp8_kv", *BF16_INDEXER, *TINY],
        {},
    ),
}
NODE_REFUSALS = {
    # Only --target here on such a node reaches these (a named ROCm target
    # is an image with aiter and its MSA kernels).
    "no_aiter": (
        ["--target", "here", *FP8_TP8, *INDEXER_CP],
        {},
        "mi355x:absent",
    ),
    "aiter_without_msa_kernels": (
        ["--target", "here", *FP8_TP8],
        AITER_SPARSE_PA,
        "mi355x:no_msa",
    ),
}
NOT_A_CHECK_REFUSAL = {
    "MiniMax-M3 fp8 index cache on vLLM's Triton indexer:": "the node self-test",
    "the config-time decision predicted ..., but vLLM planned ...": "a warning",
    "MiniMax-M3 sparse attention ignores --kv-cache-dtype-skip-layers for": "a warning",
    "describes its fp8 index cache (... as float8_e4m3fn/NONE, the stock vLLM "
    "description": "at startup, after KV planning",
    "vLLM refuses these flags:": "a usage error, vLLM's own",
    "... is not a switch value (a vllm-minimax-m3-kv variable)": (
        "a usage error, the plugin's switch (tests/entrypoints/test_check_front.py)"
    ),
    "self-test: ignoring ...: it ...; running the self-test instead": (
        "a worker's warning (tests/kernels/test_selftest_kept_verdict.py)"
    ),
    "cannot read the model config for": "a usage error",
    "vllm-minimax-m3-kv is inactive, vLLM runs unchanged:": "a warning at startup",
    "Those entries stay out and vLLM runs them unchanged; the rest apply.": (
        "a warning at startup (docs/design.md, when a site is missing)"
    ),
    "vllm-minimax-m3-kv needs vLLM ...": "a usage error",
    "Unknown vLLM environment variable detected: VLLM_MINIMAX_M3_KV_ALLOW_MIXED": (
        "vLLM's warning"
    ),
    "The checkpoint's quantization config declares an fp8 KV cache "
    "(compressed-tensors kv_cache_scheme), which vLLM applies to --kv-cache-dtype "
    "auto": "a line of a refusal, not its first",
    "Because MiniMax-M3 indexers store only bf16 or fp8 e4m3, so no indexer shares "
    "this precision": "a line of a refusal, not its first",
}
"""Quoted in docs/troubleshooting.md, and not a refusal check prints."""


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
    found = dict(zip(names, results, strict=True))
    for name, (argv, env, node) in NODE_REFUSALS.items():
        (found[name],) = run_checks([{"argv": argv, "env": env}], simulate=node)
    return found


def _node(name: str) -> str | None:
    return NODE_REFUSALS[name][2] if name in NODE_REFUSALS else None


def _argv(name: str) -> list[str]:
    return (REFUSALS.get(name) or NODE_REFUSALS[name])[0]


def test_every_refusal_in_the_troubleshooting_page_is_run_here(refusals):
    """Each refusal docs/troubleshooting.md quotes is printed by one of the
    commands above, so the test below runs its fixes."""
    text = (REPO / "docs" / "troubleshooting.md").read_text(encoding="utf-8")
    quotes = {" ".join(q.split()) for q in re.findall(r'\*\*"(.+?)"\*\*', text, re.S)}
    messages = [
        " ".join(result["plan"]["message"].split()) for result in refusals.values()
    ]
    unprinted = [
        quote
        for quote in quotes - set(NOT_A_CHECK_REFUSAL)
        if not any(
            all(part.strip() in message for part in quote.split("..."))
            for message in messages
        )
    ]
    assert unprinted == []
    assert set(NOT_A_CHECK_REFUSAL) <= quotes  # no stale exemption


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
    by_node: dict[str | None, list] = {}
    for name, result in refusals.items():
        target = _argv(name)[_argv(name).index("--target") + 1]
        for fix in result["plan"]["fixes"]:
            env, argv = split_command(fix["command"])
            case = {"argv": ["--target", target, *argv], "env": env}
            # A fix that needs software (aiter, its MSA kernels) runs once it
            # is installed: on that node, an image with aiter and the kernels.
            node = "mi355x:msa" if fix["requires"] and _node(name) else _node(name)
            by_node.setdefault(node, []).append((case, (name, fix["command"])))
    sources, rerun = [], []
    for node, runs in by_node.items():
        rerun += run_checks([case for case, _ in runs], simulate=node)
        sources += [source for _, source in runs]
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


SERVE_ON_A_NODE = """
import json, sys
from vllm_minimax_m3_kv_sim.hardware import simulate
simulate("mi355x", "msa")
from vllm.engine.arg_utils import EngineArgs
from vllm.entrypoints.common.cli_args import make_arg_parser
from vllm.utils.argparse_utils import FlexibleArgumentParser
from vllm_minimax_m3_kv import register
from vllm_minimax_m3_kv.entrypoints.check.judge import validation_cause
register()
sys.argv = ["/opt/venv/bin/vllm", "serve", *json.loads(sys.argv[1])]
args = make_arg_parser(FlexibleArgumentParser()).parse_args(sys.argv[2:])
args.model = args.model_tag  # as vllm serve's own command does
engine_args = EngineArgs.from_cli_args(args)
engine_args.skip_tokenizer_init = True
try:
    engine_args.create_engine_config()
except Exception as error:
    print(json.dumps(str(validation_cause(error))))
"""


def test_vllm_serve_prints_each_fix_as_the_whole_command_too():
    """The live hook's refusal under `vllm serve` (as its API server builds
    the config) ends with the same whole commands check prints, and each runs
    as printed."""
    from vllm_minimax_m3_kv.entrypoints.check.early import bundled_model_path
    from vllm_minimax_m3_kv_sim.plumbing.children import run_python

    served = [bundled_model_path(), *FP8_TP8, "--max-model-len", "8192", *INDEXER_CP]
    proc = run_python(["-c", SERVE_ON_A_NODE, json.dumps(served)], {}, 300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    message = json.loads(proc.stdout.strip().splitlines()[-1])
    assert "Fix with one of:" in message
    head, _, commands = message.partition(
        "The same command with each fix applied, as it runs:\n"
    )
    lines = commands.splitlines()
    assert len(lines) == head.split("Fix with one of:")[1].count("\n  ") >= 3
    rerun = []
    for line in lines:
        env, argv = split_command(line.strip())
        assert argv[:1] == [bundled_model_path()], line
        rerun.append({"argv": ["--target", "mi355x", *argv], "env": env})
    refused = [
        (line, result["stderr"])
        for line, result in zip(lines, run_checks(rerun), strict=True)
        if result["exit"] not in (0, 3)
    ]
    assert refused == []


def test_a_fix_inside_a_json_config_writes_json_values():
    # vLLM reads the JSON's values as typed: "false" would be a string.
    argv = [
        "--attention-config",
        '{"minimax_m3_indexer_cp": true, "indexer_kv_dtype": "bf16"}',
    ]
    fix = {
        "flags": [
            ["--attention-config.minimax_m3_indexer_cp", "false"],
            ["--attention-config.indexer_kv_dtype", "fp8"],
        ]
    }
    fixed = apply_fix(argv, fix)
    assert fixed[0] == "--attention-config"
    assert json.loads(fixed[1]) == {
        "minimax_m3_indexer_cp": False,
        "indexer_kv_dtype": "fp8",
    }
