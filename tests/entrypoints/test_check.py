"""``vllm-minimax-m3-kv check``: output, exit codes, and agreement with the
live plugin on the same hardware."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from vllm_minimax_m3_kv_sim import REPO
from vllm_minimax_m3_kv_sim.environments import AITER_SPARSE_PA
from vllm_minimax_m3_kv_sim.plumbing.children import (
    child_env,
    json_from_out_file,
    run_python,
)

TINY = "tests/data/minimax_m3_tiny"
MI355X_FP8_TP8 = ["--target", "mi355x", "--kv-cache-dtype", "fp8", "-tp", "8"]


def run_checks(cases: list[dict], simulate: str | None = None) -> list[dict]:
    """check's result for each case, in one process; ``simulate``
    (``GPU:AITER``) makes that process's own node one, for ``--target here``."""
    with tempfile.TemporaryDirectory() as tmp:
        cases_file = Path(tmp, "cases.json")
        cases_file.write_text(json.dumps(cases))
        node = ["--simulate", simulate] if simulate else []
        return json_from_out_file(
            [
                "-m",
                "vllm_minimax_m3_kv_sim.programs.check_batch",
                str(cases_file),
                *node,
            ]
        )


@pytest.fixture(scope="module")
def basic():
    return run_checks(
        [
            {
                "argv": ["--target", "mi355x", "--kv-cache-dtype", "fp8", "-tp", "8"],
                "env": AITER_SPARSE_PA,
            },
            {"argv": ["--target", "mi355x", "--kv-cache-dtype", "fp8", "-tp", "8"]},
            {
                "argv": [
                    "--target",
                    "mi355x",
                    "--attention-config",
                    '{"indexer_kv_dtype": "fp8"}',
                    "--kv-cache-dtype",
                    "fp8",
                    "-tp",
                    "1",
                ],
                "env": AITER_SPARSE_PA,
            },
            {"argv": ["--target", "nosuch"]},
            {"argv": ["--target", "mi355x", "--no-such-flag"]},
            {"argv": ["--target", "mi355x", "tests/data/llama_tiny"]},
            {"argv": ["--target", "mi250x", "--dtype", "float16"]},
            {"argv": ["--target", "mi250x", "--dtype", "bfloat16"]},
            {"argv": ["--target", "mi355x", "--kv-cache-dtype", "int8_per_token_head"]},
            {
                "argv": ["--target", "mi250x", "--kv-cache-dtype", "fp8", "-tp", "8"],
                "env": {"VLLM_MINIMAX_M3_KV_ALLOW_MIXED": "1"},
            },
            {"argv": ["--target", "mi355x", "-tp", "0"]},
            {  # the hub id, not cached: its bundled config
                "argv": [
                    "--target",
                    "mi355x",
                    "MiniMaxAI/MiniMax-M3",
                    "--kv-cache-dtype",
                    "fp8",
                    "-tp",
                    "8",
                ],
                "env": AITER_SPARSE_PA,
            },
            {  # the public MI355X recipe's parser flags, on the bundled config
                "argv": [*MI355X_FP8_TP8, "--reasoning-parser", "minimax_m3"],
                "env": AITER_SPARSE_PA,
            },
            # AITER unset, indexer CP on: the Triton indexer stays bf16.
            {
                "argv": [
                    *MI355X_FP8_TP8,
                    "--attention-config.minimax_m3_indexer_cp",
                    "true",
                ]
            },
            {  # both caches bf16, AITER sparse PA at two KV heads per rank
                "argv": [
                    "--target",
                    "mi355x",
                    "--block-size",
                    "128",
                    "--language-model-only",
                    "--tensor-parallel-size",
                    "2",
                ],
                "env": AITER_SPARSE_PA,
            },
            {  # MI300X with an fp8 KV cache: an fnuz index cache beside it
                "argv": [
                    "--target",
                    "mi300x",
                    "--kv-cache-dtype",
                    "fp8",
                    "--block-size",
                    "128",
                    "--language-model-only",
                    "--tensor-parallel-size",
                    "8",
                ]
            },
        ]
    )


def test_mi355x_recipe_passes_with_bundled_config(basic):
    result = basic[0]
    assert result["exit"] == 0
    plan = result["plan"]
    assert plan["architecture"] == "MiniMaxM3SparseForConditionalGeneration"
    assert plan["indexer_kv_dtype"] == "fp8" and plan["indexer_inherited"]
    assert plan["uniform_precision"] and plan["kv_block_zeroer"] == "not built"
    # Full 60-layer model, 1 KV head per rank: 15,360 + 7,296 vs 15,360 + 14,592.
    assert (plan["bytes_per_token_total"], plan["stock_bytes_per_token_total"]) == (
        22656,
        29952,
    )
    assert plan["token_capacity_vs_stock"] == pytest.approx(1.322, abs=1e-3)


def assert_triton_fp8_recipe(result: dict) -> dict:
    """An fp8 recipe at TP 8 that starts on vLLM's Triton indexer: fp8
    inherited, uniform, no zeroer, the 1.32x of the full model; its plan."""
    assert result["exit"] == 0, result
    plan = result["plan"]
    assert plan["indexer_kv_dtype"] == "fp8" and plan["indexer_inherited"]
    assert plan["fp8_indexer"] == "vLLM's Triton indexer"
    assert plan["uniform_precision"] and plan["kv_block_zeroer"] == "not built"
    assert plan["bytes_per_token_total"] == 22656
    assert plan["token_capacity_vs_stock"] == pytest.approx(1.322, abs=1e-3)
    return plan


def test_public_mi355x_recipe_passes_on_vllms_triton_indexer(basic):
    # AITER unset, as the public MI355X recipe runs: fp8 on vLLM's Triton
    # indexer, with the same capacity as the AITER recipe.
    assert_triton_fp8_recipe(basic[1])
    assert basic[0]["plan"]["fp8_indexer"] == "the AITER MSA indexer"


def test_mi300x_fp8_kv_command_runs_uniform_on_an_fnuz_index_cache(basic):
    # gfx942: vLLM's Triton indexer on an e4m3fnuz index cache, the plugin's
    # fnuz writer filling it; the capacity of the MI355X recipes.
    plan = assert_triton_fp8_recipe(basic[15])
    # The plan names the bytes: fnuz on gfx942; OCP e4m3fn goes unsaid.
    assert plan["fp8_format"] == "e4m3fnuz" and basic[1]["plan"]["fp8_format"] == ""
    from vllm_minimax_m3_kv.entrypoints.check.plan import Plan

    rows = Plan(**plan).render().splitlines()
    assert "main KV dtype            fp8 (e4m3fnuz)" in rows
    assert (
        "indexer dtype            fp8 (e4m3fnuz; inherited from the KV cache; "
        "vLLM's Triton indexer)"
    ) in rows


def test_a_bf16_pool_vllm_cannot_build_is_reported_with_vllms_reason(basic):
    # The plugin leaves bf16 pools alone, and vLLM 0.33 fails this one at model
    # build (tests/models: "requires num_kv_heads == 1 per tensor-parallel
    # rank"); check says so instead of "starts" (#38, item 5).
    result = basic[14]
    assert result["exit"] == 2, result
    plan = result["plan"]
    first, because = plan["message"].splitlines()[:2]
    assert first.startswith(
        "vLLM 0.33 fails to build this MiniMax-M3 KV pool at model build: "
    )
    assert first.endswith("on ROCm gfx950 (MI355X), both caches bf16.")
    assert because.startswith(
        "Because AITER sparse paged attention serves more than one KV head per rank"
    )
    assert plan["uniform_precision"] and plan["indexer_kv_dtype"] == "bf16"
    by_summary = {fix["summary"]: fix for fix in plan["fixes"]}
    assert by_summary["both caches bf16, as vLLM builds them"]["env"] == {
        "VLLM_ROCM_SHUFFLE_KV_CACHE_LAYOUT": "0"
    }
    assert by_summary["fp8 both: an fp8 KV cache"]["flags"] == [
        ["--kv-cache-dtype", "fp8"]
    ]


def test_a_refusal_names_each_indexers_fix(basic):
    result = basic[13]
    assert result["exit"] == 2, result
    message = result["plan"]["message"]
    assert "--attention-config.minimax_m3_indexer_cp false" in message
    assert "VLLM_ROCM_USE_AITER=1 VLLM_ROCM_SHUFFLE_KV_CACHE_LAYOUT=1" in message
    # Nothing will start, so nothing is "built".
    assert result["plan"]["kv_block_zeroer"].startswith("none: ")
    assert "refused at startup" in result["plan"]["kv_block_zeroer"]


def test_json_attention_config_is_parsed_like_vllm_serve(basic):
    plan = basic[2]["plan"]
    assert basic[2]["exit"] == 0
    assert plan["indexer_kv_dtype"] == "fp8" and not plan["indexer_inherited"]
    assert plan["token_capacity_vs_stock"] == pytest.approx(1.0)  # explicit fp8 both


def test_usage_errors_exit_1(basic):
    assert [r["exit"] for r in basic[3:6]] == [1, 1, 1]
    assert "is not a MiniMax-M3 architecture" in basic[5]["stderr"]


def test_non_bf16_non_fp8_main_caches_are_refused_with_fixes(basic):
    # A float16 model's "auto" main cache beside MiniMax-M3's bf16 indexer,
    # and an int8 main cache: one pool, two precisions, whatever the dtype.
    float16, fixed, int8 = basic[6], basic[7], basic[8]
    assert float16["exit"] == 2 and float16["plan"]["outcome"] == "error"
    assert "--dtype bfloat16 --kv-cache-dtype auto" in float16["plan"]["message"]
    assert fixed["exit"] == 0 and fixed["plan"]["uniform_precision"]
    # A plan says what "auto" stores, not "auto" (#38, item 6).
    from vllm_minimax_m3_kv.entrypoints.check.plan import Plan

    for result, stored in ((fixed, "bf16"), (float16, "float16")):
        assert result["plan"]["kv_cache_dtype"] == "auto"  # JSON keeps the flag
        rows = Plan(**result["plan"]).render().splitlines()
        assert f"main KV dtype            {stored} (auto: the model's dtype)" in rows
    assert int8["exit"] == 2 and not int8["plan"]["uniform_precision"]
    assert "VLLM_MINIMAX_M3_KV_ALLOW_MIXED=1" in int8["plan"]["message"]


def test_opted_in_mixed_pool_is_reported_honestly(basic):
    result = basic[9]
    assert result["exit"] == 3
    plan = result["plan"]
    assert plan["outcome"] == "mixed" and not plan["uniform_precision"]
    assert plan["kv_block_zeroer"].startswith("built and honoured on every worker")
    assert plan["indexer_kv_dtype"] == "bf16"
    assert plan["token_capacity_vs_stock"] == pytest.approx(1.0)


def test_a_field_vllm_refuses_is_named_with_pydantics_words(basic):
    result = basic[10]
    assert result["exit"] == 1
    assert (
        "vLLM refuses these flags: ParallelConfig.tensor_parallel_size: Input should "
        "be greater than or equal to 1" in result["stderr"]
    ), result["stderr"]


def test_the_hub_id_not_in_the_cache_judges_its_bundled_config(basic):
    result = basic[11]
    assert result["exit"] == 0, result
    plan = result["plan"]
    assert plan["model_note"].startswith(
        "MiniMaxAI/MiniMax-M3 is not in the local cache"
    )
    assert plan["bytes_per_token_total"] == 22656


def test_each_fix_says_its_capacity_against_the_command_as_typed(basic):
    # The public MI355X recipe with indexer CP on (AITER unset), refused: its
    # fixes against stock vLLM 0.33 running that command (#38, item 4).
    plan = basic[13]["plan"]
    capacity = {fix["summary"]: fix["token_capacity_vs_stock"] for fix in plan["fixes"]}
    assert capacity == {
        "keep the fp8 KV cache, fp8 indexer (vLLM's Triton indexer)": 1.322,
        "keep the fp8 KV cache, fp8 indexer (the AITER MSA indexer)": 1.322,
        "main cache bf16": 0.661,
        "accept a mixed pool: every worker zeroes new blocks": 1.0,
    }
    bf16 = next(f for f in plan["fixes"] if f["summary"] == "main cache bf16")
    assert bf16["command"].endswith(
        "# main cache bf16; 0.66x the KV tokens of stock vLLM 0.33 running the "
        "command as typed"
    )
    from vllm_minimax_m3_kv.entrypoints.check.plan import Plan

    assert (
        "token capacity vs stock  1.00x (stock vLLM 0.33 running the command as "
        "typed: 29,952 bytes/token)"
    ) in Plan(**plan).render().splitlines()


def test_json_carries_the_fixes_and_the_versions(basic):
    plan = basic[13]["plan"]  # indexer CP with AITER unset, refused
    assert plan["versions"].startswith("vllm-minimax-m3-kv ")
    assert "; vLLM 0.33" in plan["versions"]
    lines = [fix["line"] for fix in plan["fixes"]]
    assert lines and all(line in plan["message"] for line in lines)
    assert plan["fixes"][1]["env"] == {
        "VLLM_ROCM_USE_AITER": "1",
        "VLLM_ROCM_SHUFFLE_KV_CACHE_LAYOUT": "1",
    }


def test_a_reasoning_parser_is_set_aside_on_the_bundled_config(basic):
    # vLLM builds the parser from the checkpoint's tokenizer, which the
    # bundled config lacks; the pool is judged and the plan says what was not.
    result = basic[12]
    assert result["exit"] == 0, result
    plan = result["plan"]
    assert plan["uniform_precision"] and plan["indexer_kv_dtype"] == "fp8"
    assert plan["not_judged"].startswith("--reasoning-parser minimax_m3 (it needs")


# -- the check's verdict equals the live plugin's on the same hardware ----------

KV = ["auto", "fp8", "fp8_e5m2", "int8_per_token_head"]
INDEXER = ["auto", "bf16", "fp8", "mxfp4"]
ENVS = {
    "aiter": AITER_SPARSE_PA,
    "plain": {},
    "mixed_ok": {"VLLM_MINIMAX_M3_KV_ALLOW_MIXED": "1"},
}
MATRIX = [
    (target, kv, indexer, env_name)
    for target in ("mi355x", "mi300x", "b300")
    for kv, indexer in itertools.product(KV, INDEXER)
    for env_name in (
        ("aiter", "plain", "mixed_ok") if target != "b300" else ("plain", "mixed_ok")
    )
]


def _live_outcome(result: dict) -> tuple[str, str | None]:
    error = result.get("config_error")
    if error:
        assert error["from_plugin"], error
        return "error", None
    if result.get("build_error"):  # vLLM's own, at model build (bf16 pools)
        return "error", None
    # vLLM runs MiniMax-M3's "auto" indexer as bf16; check prints that.
    return "ok", {"auto": "bf16"}.get(
        result["indexer_kv_dtype"], result["indexer_kv_dtype"]
    )


def _bf16(case: dict) -> bool:
    engine = case["engine"]
    indexer = engine.get("attention_config", {}).get("indexer_kv_dtype", "auto")
    return engine.get("kv_cache_dtype", "auto") == "auto" and indexer in (
        "auto",
        "bf16",
    )


def _check_outcome(result: dict) -> tuple[str, str | None]:
    plan = result["plan"]
    if plan["outcome"] == "error":
        return "error", None
    assert result["exit"] == (3 if plan["outcome"] == "mixed" else 0)
    requested = plan["indexer_kv_dtype"]
    return "ok", "fp8" if plan["indexer_inherited"] else requested


# The pool's shape: checkpoint variants and skip layers, check against live.
DATA = "tests/data"
POOL_SHAPES = [
    (checkpoint, skip, env_name)
    for checkpoint in (
        "minimax_m3_tiny",
        "minimax_m3_tiny_key_false",
        "minimax_m3_tiny_no_sparse",
    )
    for skip in ((), ("0",), ("4",))
    for env_name in ("aiter", "plain", "mixed_ok")
]


def _flag_case(target: str, kv: str, indexer: str, env_name: str) -> dict:
    return {
        "id": f"{kv}/{indexer}/{env_name}",
        "env": ENVS[env_name],
        "engine": {
            "kv_cache_dtype": kv,
            "max_model_len": 8192,
            "attention_config": {"indexer_kv_dtype": indexer},
        },
        "argv": [
            "--target",
            target,
            TINY,
            "--max-model-len",
            "8192",
            "--kv-cache-dtype",
            kv,
            "--attention-config.indexer_kv_dtype",
            indexer,
        ],
    }


def _pool_case(checkpoint: str, skip: tuple[str, ...], env_name: str) -> dict:
    return {
        "id": f"{checkpoint}/{','.join(skip)}/{env_name}",
        "env": ENVS[env_name],
        "engine": {
            "model": f"{DATA}/{checkpoint}",
            "kv_cache_dtype": "fp8",
            "max_model_len": 8192,
            "tensor_parallel_size": 8,
            "kv_cache_dtype_skip_layers": list(skip),
        },
        "argv": [
            "--target",
            "mi355x",
            f"{DATA}/{checkpoint}",
            "--max-model-len",
            "8192",
            "-tp",
            "8",
            "--kv-cache-dtype",
            "fp8",
            *(["--kv-cache-dtype-skip-layers", *skip] if skip else []),
        ],
    }


AGREEMENT_CASES = {
    target: [_flag_case(*cell) for cell in MATRIX if cell[0] == target]
    for target in ("mi355x", "mi300x", "b300")
}
POOL_CASES = [_pool_case(*shape) for shape in POOL_SHAPES]

# Checkpoints that declare their own KV cache: no flag, auto, or an explicit
# dtype, beside every indexer setting (compressed-tensors in both layer
# orders on MI355X; modelopt and compressed-tensors on B300).
CHECKPOINT_KV_CHECKPOINTS = {
    "mi355x": (
        "minimax_m3_tiny_ct_fp8_kv",
        "minimax_m3_tiny_ct_fp8_kv_sparse_first",
    ),
    "b300": ("minimax_m3_tiny_modelopt_fp8", "minimax_m3_tiny_ct_fp8_kv"),
}


def _checkpoint_case(
    target: str, checkpoint: str, kv: str | None, indexer: str | None, env_name: str
) -> dict:
    engine: dict = {
        "model": f"{DATA}/{checkpoint}",
        "max_model_len": 8192,
        "tensor_parallel_size": 4,
    }
    argv = ["--target", target, f"{DATA}/{checkpoint}", "--max-model-len", "8192"]
    argv += ["-tp", "4"]
    if kv is not None:
        engine["kv_cache_dtype"] = kv
        argv += ["--kv-cache-dtype", kv]
    if indexer is not None:
        engine["attention_config"] = {"indexer_kv_dtype": indexer}
        argv += ["--attention-config.indexer_kv_dtype", indexer]
    return {
        "id": f"{checkpoint}/{kv or 'unset'}/{indexer or 'unset'}/{env_name}",
        "env": ENVS[env_name],
        "engine": engine,
        "argv": argv,
    }


CHECKPOINT_CASES = {
    target: [
        _checkpoint_case(target, checkpoint, kv, indexer, env_name)
        for checkpoint in checkpoints
        for kv in (None, "auto", "bfloat16", "fp8")
        for indexer in (None, "bf16", "fp8")
        for env_name in (
            ("aiter", "plain", "mixed_ok")
            if target == "mi355x"
            else ("plain", "mixed_ok")
        )
    ]
    for target, checkpoints in CHECKPOINT_KV_CHECKPOINTS.items()
}


@pytest.fixture(scope="module")
def agreement(scenario_runner) -> dict[str, dict[str, tuple]]:
    """Each case's outcome live (one process per simulated GPU, every
    environment in it, as the reliability matrix runs them) and offline (every
    check in one process: check simulates its --target itself)."""
    live = {}
    for target, cases in AGREEMENT_CASES.items():
        # Pools with both caches bf16 are built too: the plugin leaves them
        # to vLLM, whose model build is what check must agree with there.
        scenarios = [
            {"id": c["id"], "env": c["env"], "engine": c["engine"], "build": _bf16(c)}
            for c in cases
            + (POOL_CASES if target == "mi355x" else [])
            + CHECKPOINT_CASES.get(target, [])
        ]
        live[target] = scenario_runner(target, scenarios)
    every = [
        (target, case)
        for target, cases in [
            *AGREEMENT_CASES.items(),
            ("mi355x", POOL_CASES),
            *CHECKPOINT_CASES.items(),
        ]
        for case in cases
    ]
    checks = run_checks([{"argv": c["argv"], "env": c["env"]} for _, c in every])
    return {
        "live": {
            (target, key): _live_outcome(result)
            for target, results in live.items()
            for key, result in results.items()
        },
        "offline": {
            (target, case["id"]): _check_outcome(result)
            for (target, case), result in zip(every, checks, strict=True)
        },
        "live_kv": {
            (target, key): result.get("kv_cache_dtype")
            for target, results in live.items()
            for key, result in results.items()
        },
        "plans": {
            (target, case["id"]): result["plan"]
            for (target, case), result in zip(every, checks, strict=True)
        },
        "stderr": {
            (target, case["id"]): result["stderr"]
            for (target, case), result in zip(every, checks, strict=True)
        },
    }


@pytest.mark.parametrize("target", ["mi355x", "mi300x", "b300"])
def test_check_agrees_with_live_plugin(target, agreement):
    keys = [(target, case["id"]) for case in AGREEMENT_CASES[target]]
    live = {key: agreement["live"][key] for key in keys}
    assert {key: agreement["offline"][key] for key in keys} == live
    assert {outcome for outcome, _ in live.values()} == {"ok", "error"}
    # The opt-in reached a mixed start that both paths agree on.
    assert live[(target, "int8_per_token_head/auto/mixed_ok")] == ("ok", "bf16")


def test_check_agrees_with_live_plugin_on_the_pool_vllm_builds(agreement):
    keys = [("mi355x", case["id"]) for case in POOL_CASES]
    live = {key: agreement["live"][key] for key in keys}
    assert {key: agreement["offline"][key] for key in keys} == live
    # Every kind of answer is among them.
    assert live[("mi355x", "minimax_m3_tiny_key_false//aiter")] == ("ok", "fp8")
    assert live[("mi355x", "minimax_m3_tiny_no_sparse//plain")] == ("ok", "bf16")
    assert live[("mi355x", "minimax_m3_tiny/0/aiter")] == ("error", None)
    # Opted in beside a skipped dense layer, the index cache stays fp8 (vLLM's
    # Triton indexer, AITER unset).
    assert live[("mi355x", "minimax_m3_tiny/0/mixed_ok")] == ("ok", "fp8")
    ignored = agreement["stderr"][("mi355x", "minimax_m3_tiny/4/aiter")]
    assert "warning: MiniMax-M3 sparse attention ignores" in ignored


@pytest.mark.parametrize("target", sorted(CHECKPOINT_KV_CHECKPOINTS))
def test_check_agrees_with_live_plugin_on_checkpoint_kv_caches(target, agreement):
    keys = [(target, case["id"]) for case in CHECKPOINT_CASES[target]]
    live = {key: agreement["live"][key] for key in keys}
    assert {key: agreement["offline"][key] for key in keys} == live
    plans = {key: agreement["plans"][key] for key in keys}
    # The main KV dtype check prints is the one the live config holds once the
    # hook ran (where it starts), and says where it came from.
    for key in keys:
        plan, live_kv = plans[key], agreement["live_kv"][key]
        if live[key][0] == "ok":
            assert plan["kv_cache_dtype"] == live_kv, key
        from_checkpoint = plan["kv_cache_dtype_source"] != "--kv-cache-dtype"
        assert from_checkpoint == (key[1].split("/")[1] in ("unset", "auto")), key
    checkpoint = CHECKPOINT_KV_CHECKPOINTS[target][0]
    if target == "mi355x":
        # Inherited with AITER and without (vLLM's Triton indexer), an
        # explicit fp8 indexer uniform.
        assert live[(target, f"{checkpoint}/unset/unset/aiter")] == ("ok", "fp8")
        assert live[(target, f"{checkpoint}/unset/unset/plain")] == ("ok", "fp8")
        assert live[(target, f"{checkpoint}/unset/fp8/aiter")] == ("ok", "fp8")
        plan = plans[(target, f"{checkpoint}/unset/unset/aiter")]
        assert plan["kv_cache_dtype_source"] == (
            "from the checkpoint's compressed-tensors kv_cache_scheme"
        )
    else:
        assert live[(target, f"{checkpoint}/unset/unset/plain")] == ("ok", "fp8")
        plan = plans[(target, f"{checkpoint}/unset/unset/plain")]
        assert plan["kv_cache_dtype"] == "fp8_e4m3"
        assert plan["kv_cache_dtype_source"] == (
            "from the checkpoint's modelopt kv_cache_quant_algo"
        )


# -- the command as a user runs it ---------------------------------------------


def run_cli(*argv: str, env: dict[str, str] | None = None, timeout: float = 120):
    start = time.monotonic()
    proc = run_python(["-m", "vllm_minimax_m3_kv", "check", *argv], env, timeout)
    return proc, time.monotonic() - start


def test_check_is_quiet_unless_verbose():
    recipe = ("--target", "mi355x", "--kv-cache-dtype", "fp8", "-tp", "8")
    quiet, _ = run_cli(*recipe, env=AITER_SPARSE_PA)
    assert quiet.returncode == 0, quiet.stderr
    assert quiet.stderr == ""  # no vLLM / torch import noise
    assert "uniform precision        yes" in quiet.stdout
    verbose, _ = run_cli(*recipe, "--verbose", env=AITER_SPARSE_PA)
    assert verbose.returncode == 0
    assert verbose.stdout == quiet.stdout


def test_help_lists_checks_own_flags_and_how_to_see_vllms():
    proc, _ = run_cli("--help")
    assert proc.returncode == 0 and proc.stderr == ""
    own = proc.stdout.index("check options")
    for flag in ("--target", "--json", "--verbose"):
        assert proc.stdout.index(flag, own) > own
    assert "(required)" in proc.stdout and "default: None" not in proc.stdout
    assert "--help=GROUP" in proc.stdout and "exit codes:" in proc.stdout


def test_vllms_own_flag_groups_are_one_help_away():
    proc, _ = run_cli("--help=CacheConfig")
    assert proc.returncode == 0, proc.stderr
    assert "--kv-cache-dtype-skip-layers" in proc.stdout


def _without_importing_vllm(*argv: str, python: str = sys.executable) -> dict:
    """Run check's main in a fresh interpreter; report what it imported."""
    code = (
        "import contextlib, io, json, sys\n"
        "from vllm_minimax_m3_kv.entrypoints.cli.main import main\n"
        "out, err = io.StringIO(), io.StringIO()\n"
        "with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):\n"
        f"    code = main({list(argv)!r})\n"
        "print(json.dumps({'exit': code, 'stdout': out.getvalue(),\n"
        "    'stderr': err.getvalue(), 'vllm': 'vllm' in sys.modules,\n"
        "    'torch': 'torch' in sys.modules}))\n"
    )
    proc = subprocess.run(
        [python, "-c", code],
        cwd=REPO,
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (("--help",), None),
        ((), "the following argument is required: --target (one of: mi355x"),
        (("--target", "mi35x"), "unknown target 'mi35x' (did you mean mi355x?)"),
        (("--target", "mi355x", "/models/typo/MiniMax-M3"), "cannot read the model"),
        (
            ("--target", "mi355x", "--model", "nosuchorg/NoSuch"),
            "cannot read the model",
        ),
    ],
)
def test_help_and_usage_errors_answer_without_importing_vllm(argv, says):
    result = _without_importing_vllm(*argv)
    assert not result["vllm"] and not result["torch"], result
    if says is None:
        assert result["exit"] == 0 and "check options" in result["stdout"]
        return
    assert result["exit"] == 1 and result["stdout"] == ""
    lines = result["stderr"].strip().splitlines()
    assert len(lines) == 1 and says in lines[0], result["stderr"]


def _python_without_vllm() -> str:
    """This interpreter's base installation: the venv's packages (vLLM
    among them) are not on its path."""
    python = os.path.join(sys.base_prefix, "bin", "python3")
    probe = subprocess.run([python, "-c", "import vllm"], capture_output=True)
    if probe.returncode == 0:
        pytest.skip("the base interpreter has vLLM installed")
    return python


def test_without_vllm_help_works_and_a_verdict_names_the_rocm_safe_install():
    python = _python_without_vllm()
    helped = _without_importing_vllm("--help", python=python)
    assert helped["exit"] == 0 and "check options" in helped["stdout"]
    refused = _without_importing_vllm("--target", "mi355x", python=python)
    assert refused["exit"] == 1
    lines = refused["stderr"].strip().splitlines()
    assert len(lines) == 1, refused["stderr"]
    assert "vLLM is not installed" in lines[0]
    assert ">=0.33,<0.34" in lines[0] and "pip install --no-deps" in lines[0]


def test_plan_on_stdout_refusal_and_fixes_on_stderr():
    refused, _ = run_cli("--target", "mi250x", "--kv-cache-dtype", "fp8", "-tp", "8")
    assert refused.returncode == 2
    assert "KV block zeroer          none:" in refused.stdout
    assert "Fix with one of:" not in refused.stdout
    assert refused.stderr.startswith("MiniMax-M3 KV precision:")
    assert "Fix with one of:" in refused.stderr
    mixed, _ = run_cli(
        "--target",
        "mi250x",
        "--kv-cache-dtype",
        "fp8",
        env={"VLLM_MINIMAX_M3_KV_ALLOW_MIXED": "1"},
    )
    assert mixed.returncode == 3
    assert mixed.stderr.startswith("warning: mixed KV pool by")
    assert "mixed KV pool" not in mixed.stdout


@pytest.mark.parametrize("model", ["nosuchorg/NoSuchModel", "/models/typo/MiniMax-M3"])
def test_unreachable_model_fails_fast_in_one_line_with_a_hint(model):
    proc, seconds = run_cli("--target", "mi355x", model, timeout=90)
    assert proc.returncode == 1
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert "local checkpoint directory" in lines[0]
    assert "omit the model to judge the bundled" in lines[0]
    assert seconds < 60  # it retried for 109 s before


# -- check refuses what `vllm serve` refuses, and accepts what it accepts ------

PARITY_LINES = {
    "recipe": ["-tp", "8", "--kv-cache-dtype", "fp8"],
    "tp3": ["-tp", "3", "--kv-cache-dtype", "fp8"],
    "garbage_dtype": ["--kv-cache-dtype", "garbage"],
    "too_long": ["--max-model-len", "1000000000"],
    "int8_main": ["--kv-cache-dtype", "int8_per_token_head"],
    "float16_main": ["--kv-cache-dtype", "float16"],
    "mxfp4_indexer": [
        "-tp",
        "8",
        "--kv-cache-dtype",
        "fp8",
        "--attention-config.indexer_kv_dtype",
        "mxfp4",
    ],
    "bf16": ["-tp", "8", "--kv-cache-dtype", "auto"],
    # Both bf16 at two KV heads per rank: vLLM fails at model build (built live).
    "bf16_tp2": ["-tp", "2", "--kv-cache-dtype", "auto"],
    "missing_model": ["--model", "/nonexistent/typo/MiniMax-M3"],
}


BUILT_LIVE = {"bf16_tp2"}
"""Lines whose verdict vLLM gives only at model build."""


def _engine_from_flags(argv: list[str]) -> dict:
    """The same flags as EngineArgs fields, for the live run."""
    engine: dict = {"model": "vllm_minimax_m3_kv/data/minimax_m3"}
    words = iter(argv)
    for flag in words:
        value = next(words)
        if flag == "-tp":
            engine["tensor_parallel_size"] = int(value)
        elif flag == "--max-model-len":
            engine["max_model_len"] = int(value)
        elif flag == "--attention-config.indexer_kv_dtype":
            engine["attention_config"] = {"indexer_kv_dtype": value}
        else:
            engine[flag.removeprefix("--").replace("-", "_")] = value
    return engine


def test_check_accepts_and_refuses_what_vllm_serve_does(scenario_runner):
    live = scenario_runner(
        "mi355x",
        [
            {
                "id": name,
                "env": AITER_SPARSE_PA,
                "build": name in BUILT_LIVE,
                "engine": _engine_from_flags(argv),
            }
            for name, argv in PARITY_LINES.items()
        ],
        env={"HF_HUB_OFFLINE": "1"},
    )
    checks = run_checks(
        [
            {
                "argv": ["--target", "mi355x", "--block-size", "128", *argv],
                "env": AITER_SPARSE_PA,
            }
            for argv in PARITY_LINES.values()
        ]
    )
    verdicts = {}
    for name, result in zip(PARITY_LINES, checks, strict=True):
        assert "Traceback" not in result["stderr"], (name, result["stderr"])
        if result["exit"] == 1:
            assert len(result["stderr"].strip().splitlines()) == 1, result["stderr"]
        check_accepts = result["exit"] in (0, 3)
        live_accepts = not {"config_error", "build_error"} & set(live[name])
        verdicts[name] = (check_accepts, live_accepts)
    assert all(ours == theirs for ours, theirs in verdicts.values()), verdicts
    assert verdicts["recipe"] == (True, True) and verdicts["bf16"] == (True, True)
    assert verdicts["tp3"] == (False, False)
    assert verdicts["bf16_tp2"] == (False, False)


def test_the_plan_shows_the_mtp_drafter_and_pipeline_stages_that_differ():
    # #38 item 6: a drafter refusal is about the drafter's main cache, and a
    # stage holding another pool than the first says so.
    mtp = '{"method":"mtp","num_speculative_tokens":1,"kv_cache_dtype":"auto"}'
    fp8_b300 = ["--target", "b300", "--kv-cache-dtype", "fp8"]
    skip_layer_0 = ["--kv-cache-dtype-skip-layers", "0"]
    drafter, stages, same_stages = run_checks(
        [
            {"argv": [*fp8_b300, "-tp", "8", "--speculative-config", mtp]},
            {
                "argv": [*fp8_b300, "-tp", "4", "-pp", "2", *skip_layer_0],
                "env": {"VLLM_MINIMAX_M3_KV_ALLOW_MIXED": "1"},
            },
            {"argv": [*fp8_b300, "-tp", "4", "-pp", "2"]},
        ]
    )
    from vllm_minimax_m3_kv.entrypoints.check.plan import Plan

    assert drafter["exit"] == 2
    plan = Plan(**drafter["plan"])
    assert plan.drafter == (
        "main KV bfloat16 (speculative_config.kv_cache_dtype auto: the model "
        "dtype), index cache fp8 (the target's indexer)"
    )
    # The target's own pool, not stock's: the drafter is what is refused.
    assert plan.indexer_kv_dtype == "fp8" and plan.bytes_per_token_total == 22_656
    assert "MTP drafter              main KV bfloat16" in plan.render()
    assert stages["exit"] == 3
    rows = [
        line
        for line in Plan(**stages["plan"]).render().splitlines()
        if line.startswith("PP stage")
    ]
    assert rows == [
        "PP stage 0 of 2          layers 0-29: main bfloat16 + fp8; index cache "
        "fp8 on 27 layers",
        "PP stage 1 of 2          layers 30-59: main fp8; index cache fp8 on 30 layers",
    ]
    assert same_stages["exit"] == 0
    uniform = Plan(**same_stages["plan"])
    assert len(uniform.pipeline_stages) == 2 and "PP stage" not in uniform.render()
