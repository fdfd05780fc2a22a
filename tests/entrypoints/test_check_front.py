"""What a new user hits first with ``check``: the off switch, target names,
mistyped commands and flags, ``--version``, help groups, a Ray layout on a
machine without Ray, and a machine without vLLM."""

from __future__ import annotations

import importlib.util
import json
import re

import pytest

from tests.entrypoints.test_check import (
    AITER_SPARSE_PA,
    _python_without_vllm,
    _without_importing_vllm,
    run_checks,
    run_cli,
)
from vllm_minimax_m3_kv_sim.plumbing.children import json_from_stdout, run_python

RECIPE = ["--kv-cache-dtype", "fp8", "--block-size", "128", "-tp", "8"]


@pytest.fixture(scope="module")
def plans():
    return run_checks(
        [
            {
                "argv": ["--target", "mi355x", *RECIPE],
                "env": {**AITER_SPARSE_PA, "VLLM_PLUGINS": ""},
            },
            {
                "argv": ["--target", "mi355x", *RECIPE],
                "env": {**AITER_SPARSE_PA, "VLLM_PLUGINS": "lora_filesystem_resolver"},
            },
            {
                "argv": ["--target", "mi355x", *RECIPE],
                "env": {**AITER_SPARSE_PA, "VLLM_PLUGINS": "minimax_m3_kv"},
            },
            {"argv": ["--target", "MI350X", *RECIPE], "env": AITER_SPARSE_PA},
            {"argv": ["--target", "h100", *RECIPE]},
            {
                "argv": ["--target", "mi355x", "--kv-cache-dtype", "auto"],
                "env": {"VLLM_PLUGINS": ""},
            },
            {
                "argv": [
                    "--target",
                    "mi355x",
                    "--kv-cache-dtype",
                    "fp8",
                    "-tp",
                    "4",
                    "--pipeline-parallel-size",
                    "2",
                    "--distributed-executor-backend",
                    "ray",
                ],
                "env": AITER_SPARSE_PA,
            },
            {  # gfx950, AITER sparse PA, a checkpoint the MSA indexer cannot run
                "argv": [
                    "--target",
                    "mi355x",
                    "tests/data/minimax_m3_tiny_topk32",
                    *RECIPE[:4],
                    "-tp",
                    "4",
                    "--max-model-len",
                    "8192",
                ],
                "env": AITER_SPARSE_PA,
            },
        ]
    )


def test_gfx950_beside_aiter_sparse_pa_refuses_the_writer_nothing_checks(plans):
    # There vLLM's Triton indexer would read an index cache AITER's kernels
    # or vLLM's unclamped Triton insert wrote (before: exit 0, inherited fp8).
    result = plans[7]
    assert result["exit"] == 2, result
    assert "would be written by AITER's kernels" in result["stderr"]
    assert (
        "VLLM_ROCM_SHUFFLE_KV_CACHE_LAYOUT=0  # keep the fp8 KV cache"
        in (result["stderr"])
    )


@pytest.fixture(scope="module")
def serve_switch_errors() -> dict[str, str]:
    """What vLLM raises at start, with the plugin, for each switch = maybe."""
    code = (
        "import json, os\n"
        "from vllm.plugins import load_general_plugins\n"
        "load_general_plugins()\n"
        "import vllm.envs as envs\n"
        "from vllm_minimax_m3_kv.envs import SWITCHES\n"
        "said = {}\n"
        "for name in SWITCHES:\n"
        "    os.environ[name] = 'maybe'\n"
        "    try:\n"
        "        getattr(envs, name)\n"
        "    except ValueError as error:\n"
        "        said[name] = str(error)\n"
        "    del os.environ[name]\n"
        "print(json.dumps(said))\n"
    )
    return json_from_stdout(["-c", code], {}, 300)


@pytest.mark.parametrize(
    "name",
    [
        "VLLM_MINIMAX_M3_KV_SKIP_SELFTEST",
        "VLLM_MINIMAX_M3_KV_ALLOW_MIXED",
        "VLLM_MINIMAX_M3_KV_FP8_BALANCED_DECODE",
    ],
)
def test_a_plugin_switch_serve_cannot_read_is_refused_in_serves_words(
    name, serve_switch_errors
):
    # vLLM evaluates the plugin's variables at start, for every model; check
    # said exit 0 for SKIP_SELFTEST=maybe and "vLLM refuses these flags" for
    # ALLOW_MIXED=maybe.
    serve = serve_switch_errors[name]
    assert f"{name}='maybe'" in serve and "vllm-minimax-m3-kv variable" in serve
    proc, _ = run_cli("--target", "mi355x", *RECIPE, env={name: "maybe"})
    assert proc.returncode == 1 and proc.stdout == ""
    assert (
        proc.stderr == f"vllm-minimax-m3-kv check: vllm serve stops at start: {serve}\n"
    )


def test_with_the_plugin_left_out_check_describes_stock_vllm(plans):
    for off in plans[:2]:
        assert off["exit"] == 3, off["stderr"]  # stock starts it, mixed
        plan = off["plan"]
        assert plan["plugin"].startswith("off: VLLM_PLUGINS leaves out minimax_m3_kv")
        assert plan["indexer_kv_dtype"] == "bf16" and not plan["indexer_inherited"]
        assert not plan["uniform_precision"]
        assert plan["kv_block_zeroer"].startswith("built on every worker")
        assert plan["token_capacity_vs_stock"] == 1.0
        assert plan["bytes_per_token_total"] == 29952
    on = plans[2]  # listed by name: loaded, as vllm serve would
    assert on["exit"] == 0 and on["plan"]["indexer_inherited"]
    assert on["plan"]["plugin"] == "on"
    # Both caches bf16 is one precision for stock too.
    bf16 = plans[5]
    assert bf16["exit"] == 0 and bf16["plan"]["uniform_precision"]


def test_every_gpu_in_the_support_table_is_a_target_in_any_case(plans):
    mi350x, h100 = plans[3], plans[4]
    assert mi350x["exit"] == 0 and "ROCm gfx950 (MI350X)" in mi350x["plan"]["target"]
    assert h100["exit"] == 0 and "CUDA sm_90 (H100)" in h100["plan"]["target"]
    assert h100["plan"]["indexer_inherited"]


def test_an_unknown_target_lists_the_valid_names():
    result = _without_importing_vllm("--target", "mi400x")
    assert result["exit"] == 1 and not result["vllm"]
    line = result["stderr"].strip()
    for name in ("mi355x", "mi350x", "mi300x", "b300", "h100", "a100"):
        assert name in line, line


@pytest.mark.skipif(importlib.util.find_spec("ray") is not None, reason="Ray installed")
def test_a_ray_layout_is_judged_without_ray(plans):
    ray = plans[6]
    assert ray["exit"] == 0, ray["stderr"]
    assert ray["plan"]["uniform_precision"]
    assert ray["plan"]["executor_note"].startswith(
        "ray (not installed here, not imported"
    )


def test_a_mistyped_command_says_so_and_version_needs_no_vllm():
    typo = _without_importing_vllm("chek", "--target", "mi355x")
    assert typo["exit"] == 1 and not typo["vllm"]
    assert (
        "unknown command 'chek' (did you mean check?); commands: check"
        in (typo["stderr"])
    )
    version = _without_importing_vllm("--version")
    assert version["exit"] == 0 and not version["vllm"] and not version["torch"]
    assert version["stdout"].startswith("vllm-minimax-m3-kv ")
    assert "; vLLM 0.33" in version["stdout"]


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (
            ("--target", "mi355x", "--kv-cache-dtype", "fp9"),
            "--kv-cache-dtype 'fp9' is not one vLLM takes; did you mean fp8?",
        ),
        (
            ("--target", "b300", "--tensor-parallel-size", "3"),
            "--tensor-parallel-size 3 does not divide this model's 64 attention heads"
            ", which vLLM requires; valid sizes: 1, 2, 4, 8, 16, 32, 64",
        ),
        (("--target", "b300", "--tensor_parallel_size=6"), "valid sizes: 1, 2, 4, 8"),
        (
            ("--target", "mi355x", "--kv-cache-dtpye", "fp8", "-tp", "8"),
            "vLLM takes no flag --kv-cache-dtpye; did you mean --kv-cache-dtype?",
        ),
        (
            ("--target", "mi355x", "--max_model_lenn=8192"),
            "did you mean --max-model-len?",
        ),
        (
            ("--target", "mi355x", "--attention-config.indexer_kv_dtype", "fp9"),
            "indexer_kv_dtype 'fp9' is no indexer dtype vLLM names; did you mean fp8?",
        ),
        (
            (
                "--target",
                "mi355x",
                "--attention-config",
                '{"indexer_kv_dtype": "bf61"}',
            ),
            "did you mean bf16?",
        ),
    ],
)
def test_known_bad_flag_values_are_answered_before_importing_vllm(argv, says):
    result = _without_importing_vllm(*argv)
    assert result["exit"] == 1 and not result["vllm"], result
    assert says in result["stderr"] and len(result["stderr"].splitlines()) == 1


def test_the_early_answers_agree_with_vllms_own_validation():
    """The KV dtypes read from vLLM's source are vLLM's list; every KV dtype
    vLLM takes passes the early check, typos fail both, and
    each TP size passes it exactly when vLLM's ModelConfig accepts it."""
    answers = json_from_stdout(["-m", "tests.entrypoints.early_answers"])
    # What check and the policy tests read from vLLM's source is its own list.
    assert answers["kv_dtypes_read_from_source"] == answers["kv_dtypes_of_vllm"]
    assert answers["kv_accepted_by_vllm_rejected_early"] == []
    assert answers["kv_typos_accepted_by_either"] == []
    assert answers["tp_disagreements"] == []
    assert answers["tp_checked"] >= 16
    assert answers["serve_flags_shipped"] == answers["serve_flags_of_vllm"]
    # check's own flags come from its parser, all of them, and none is shipped
    # as vLLM's (--commands once was).
    assert answers["own_flags"] == [
        "--commands",
        "--json",
        "--quiet",
        "--target",
        "--verbose",
    ]
    assert not set(answers["own_flags"]) & set(answers["serve_flags_shipped"])
    assert answers["valid_flags_called_typos"] == []
    assert answers["groups_with_help"] >= 15 and answers["group_help_differs"] == []


def test_help_for_a_flag_group_needs_no_vllm_import():
    # #38 item 7: from the shipped table, which matches the installed vLLM.
    for keyword in ("CacheConfig", "attentionconfig", "PARALLELCONFIG"):
        result = _without_importing_vllm(f"--help={keyword}")
        assert result["exit"] == 0 and not result["vllm"] and not result["torch"]
    assert "--kv-cache-dtype" in _without_importing_vllm("--help=CacheConfig")["stdout"]


def test_help_names_the_groups_and_where_the_indexer_dtype_is():
    proc, _ = run_cli("--help")
    assert "Common groups:" in proc.stdout and "CacheConfig" in proc.stdout
    assert "--help=attention-config" in proc.stdout
    attention, _ = run_cli("--help=AttentionConfig")
    assert attention.returncode == 0
    assert "--attention-config.indexer_kv_dtype fp8" in attention.stdout
    nothing, _ = run_cli("--help=NoSuchGroup")
    assert nothing.returncode == 1 and nothing.stdout == ""
    assert "--help=NoSuchGroup: no `vllm serve` flag group or flag matches" in (
        nothing.stderr
    )


def test_without_vllm_every_answer_is_one_line_with_a_working_install():
    python = _python_without_vllm()
    for argv in (("--target", "mi355x"), ("--help=CacheConfig",)):
        result = _without_importing_vllm(*argv, python=python)
        assert result["exit"] == 1, result
        lines = result["stderr"].strip().splitlines()
        assert len(lines) == 1 and "Traceback" not in result["stderr"], result
        assert "vLLM is not installed" in lines[0]
        assert "pip install 'vllm>=0.33,<0.34'" in lines[0]
        assert "pip install --no-deps /path/to/vllm-minimax-m3-kv" in lines[0]


def test_no_advice_names_an_install_from_the_package_index(tmp_path):
    """The package is not on the index: `pip install vllm-minimax-m3-kv` (with
    or without a version) cannot work, so nothing may advise it."""
    from tests.test_docs import DOCS, PACKAGE

    texts = [p.read_text() for p in (*DOCS, *PACKAGE.rglob("*.py"))]
    for text in texts:
        assert "install --no-deps vllm-minimax-m3-kv" not in text
        assert "pip install vllm-minimax-m3-kv" not in text
    json.dumps(texts)  # every file was read as text


def test_status_says_whether_vllm_loads_the_plugin_here():
    # vLLM's own plugin loader, on this node; and what VLLM_PLUGINS does.
    here = run_python(["-m", "vllm_minimax_m3_kv", "status"], {}, 120)
    assert here.returncode == 0, here.stdout + here.stderr
    assert "loaded by vLLM      yes" in here.stdout
    assert "register()          would activate minimax_m3_config_hook" in here.stdout
    assert re.search(r"vllm-minimax-m3-kv  \S+ \(source [0-9a-f]{12}", here.stdout)
    left_out = run_python(
        ["-m", "vllm_minimax_m3_kv", "status"],
        {"VLLM_PLUGINS": "lora_filesystem_resolver"},
        120,
    )
    assert left_out.returncode == 1
    assert "leaves out minimax_m3_kv, so vLLM runs without it" in left_out.stdout
    assert "not reached" in left_out.stdout


def test_version_carries_a_fingerprint_of_the_installed_sources():
    version = _without_importing_vllm("--version")
    assert re.match(
        r"vllm-minimax-m3-kv \S+ \(source [0-9a-f]{12}(, git [0-9a-f]{12}(-dirty)?)?\); vLLM ",
        version["stdout"],
    ), version


def test_quiet_prints_no_plan_but_still_the_refusal_and_its_fixes():
    refused = [
        "-m",
        "vllm_minimax_m3_kv",
        "check",
        "--target",
        "mi355x",
        "--quiet",
        "--kv-cache-dtype",
        "fp8",
        "--attention-config.indexer_kv_dtype",
        "bf16",
    ]
    proc = run_python(refused, {}, 300)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stdout == ""
    assert "Fix with one of:" in proc.stderr
    both = run_python([*refused, "--json"], {}, 120)
    assert both.returncode == 1
    assert "not allowed with argument" in both.stderr


def test_target_here_without_a_gpu_says_so_in_one_line():
    proc = run_python(
        [
            "-m",
            "vllm_minimax_m3_kv",
            "check",
            "--target",
            "here",
            "--kv-cache-dtype",
            "fp8",
        ],
        {},
        120,
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert "--target here: vLLM finds no CUDA or ROCm GPU on this machine" in line


HERE_ON_A_NODE = """
import contextlib, io, json, os, sys
from vllm_minimax_m3_kv_sim.hardware import simulate
simulate("mi355x", sys.argv[1])  # this node's GPU, and its aiter package
from vllm_minimax_m3_kv.entrypoints.check.main import main
os.environ.update({"VLLM_ROCM_USE_AITER": "1", "VLLM_ROCM_SHUFFLE_KV_CACHE_LAYOUT": "1"})
codes = {}
for target in ("here", "mi355x"):
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        codes[target] = [main(["--target", target, "--kv-cache-dtype", "fp8", "-tp", "8", "--json"]), json.loads(out.getvalue())]
print(json.dumps(codes))
"""


@pytest.mark.parametrize("aiter", ["absent", "no_msa", "msa"])
def test_target_here_judges_this_nodes_aiter(aiter):
    # --target mi355x assumes a ROCm image with aiter and its MSA kernels;
    # --target here reads the node's own.
    proc = run_python(["-c", HERE_ON_A_NODE, aiter], {}, 300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    codes = json.loads(proc.stdout.strip().splitlines()[-1])
    (here, here_plan), (named, _) = codes["here"], codes["mi355x"]
    assert named == 0
    assert here_plan["target"].startswith("here (ROCm gfx950")
    if aiter == "msa":
        assert here == 0 and here_plan["indexer_kv_dtype"] == "fp8"
        assert here_plan["target"].endswith(", aiter with the MSA kernels)")
        assert here_plan["fp8_indexer"] == "the AITER MSA indexer"
    elif aiter == "absent":
        # No aiter: AITER's switches are off whatever the variables say, and
        # vLLM's Triton indexer runs the fp8 index cache.
        assert here == 0 and here_plan["indexer_kv_dtype"] == "fp8"
        assert here_plan["fp8_indexer"] == "vLLM's Triton indexer"
    else:
        # aiter without the MSA kernels: vLLM still selects the MSA indexer
        # (its gate does not look for them), which then cannot run.
        assert here == 2, here_plan
        assert "lacks the MSA kernels" in here_plan["message"]


@pytest.mark.parametrize(
    ("argv", "here"),
    [
        (["--target", "here"], True),
        (["--target", "HERE"], True),  # targets are taken in any case
        (["--target=Here", "--kv-cache-dtype", "fp8"], True),
        (["--target", "mi355x"], False),
        (["--kv-cache-dtype", "fp8"], False),
    ],
)
def test_only_target_here_keeps_vllms_own_platform(argv, here):
    # A named target is judged on vLLM's CPU platform; here on the node's.
    from vllm_minimax_m3_kv.entrypoints.check.early import judges_this_machine

    assert judges_this_machine(argv) is here


def test_a_mistyped_target_gets_the_nearest_name():
    from vllm_minimax_m3_kv.entrypoints.check.arguments import CheckUsageError
    from vllm_minimax_m3_kv.entrypoints.check.early import judge_without_vllm

    with pytest.raises(
        CheckUsageError, match=r"'mi35x' \(did you mean mi355x\?\); one of"
    ):
        judge_without_vllm(["--target", "mi35x"])
    with pytest.raises(CheckUsageError) as far_off:
        judge_without_vllm(["--target", "nosuch"])
    assert "did you mean" not in str(far_off.value)
    assert "mi355x, mi350x" in str(far_off.value)
