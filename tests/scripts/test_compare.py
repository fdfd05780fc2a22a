"""KV_PRECISION=compare: the same workload served and benchmarked once per
pool, one server at a time, then one table and the pool to run. Against the
stand-in `vllm` (and `lm_eval`), whose figures each test sets per pool."""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import time

import pytest

from tests.scripts.test_launch_scripts import (
    assert_no_server_left,
    inputs,
    run_script,
    script_process,
    server_pids,
)

MI355X = "minimaxm3_fp8_mi355x.sh"
# Decision-rule tests: the preflight is tested elsewhere, so it always passes.
NO_PREFLIGHT = {"CHECK_BIN": "true"}


def compare(tmp_path, pools: dict, script=MI355X, *args, **env):
    # Eight teacher-forced documents a length keep the stand-in runs short.
    values = inputs(
        tmp_path,
        **{
            "KV_PRECISION": "compare",
            "STANDIN_POOLS": json.dumps(pools),
            "RUN_EVAL": "1",
            "LOGPROB_EVAL_DOCS": "8",
            **env,
        },
    )
    return run_script(script, values, *args, with_eval=True)


def decision(out: str) -> str:
    return next(line for line in out.splitlines() if line.startswith("decision:"))


def report(tmp_path) -> dict:
    return json.loads((tmp_path / "results" / "compare.json").read_text())


def sections(out: str) -> dict[str, str]:
    """Each pool's part of a compare run's output; the reference's rerun as
    ``<pool>-rerun``."""
    parts = re.split(r"== compare: (noise rerun: )?KV_PRECISION=", out)[1:]
    return {
        part.split(" ", 1)[0] + ("-rerun" if rerun else ""): part
        for rerun, part in zip(parts[::2], parts[1::2], strict=True)
    }


AITER_VARIABLES = ("VLLM_ROCM_USE_AITER", "VLLM_ROCM_SHUFFLE_KV_CACHE_LAYOUT")


def _aiter_environment(section: str) -> list[str]:
    """The AITER variables a pool's server is given, from its environment block."""
    block = section.split("environment\n", 1)[1].split("== serve", 1)[0]
    return sorted(
        line.strip() for line in block.splitlines()
        if line.strip().startswith(AITER_VARIABLES)
    )  # fmt: skip


@pytest.mark.parametrize(
    ("isl", "conc", "aiter"),
    [
        # The public recipe's short-context regime: AITER unset in both pools.
        ("1024", "4", []),
        # Its long-context regime, where it turns AITER sparse PA on: in both.
        ("8192", "64", [f"{name}=1" for name in sorted(AITER_VARIABLES)]),
    ],
)
def test_the_pools_differ_in_precision_alone_at_every_workload(
    tmp_path, isl, conc, aiter
):
    values = inputs(
        tmp_path, KV_PRECISION="compare", ISL=isl, CONC=conc, MAX_MODEL_LEN="16384",
        **NO_PREFLIGHT,
    )  # fmt: skip
    proc = run_script(MI355X, values, "--dry-run")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    runs = sections(proc.stdout)
    assert list(runs) == ["stock", "fp8"]
    assert _aiter_environment(runs["stock"]) == aiter
    assert _aiter_environment(runs["fp8"]) == aiter


def test_mi300x_compares_the_public_bf16_recipe_with_the_fnuz_fp8_pool(tmp_path):
    """MI300X's public recipe keeps a bf16 KV cache: the reference pool; the
    fp8 pool turns AITER sparse PA off and runs the node self-test first."""
    values = inputs(
        tmp_path,
        KV_PRECISION="compare",
        VLLM_ROCM_USE_AITER="1",
        VLLM_ROCM_SHUFFLE_KV_CACHE_LAYOUT="1",
    )
    proc = run_script("minimaxm3_fp8_mi300x.sh", values, "--dry-run")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    runs = sections(proc.stdout)
    assert list(runs) == ["stock", "fp8"]
    stock, fp8 = runs["stock"], runs["fp8"]
    environment = stock.split("== mi300x: environment", 1)[1].split("== serve")[0]
    assert "--kv-cache-dtype auto" in stock and "VLLM_ROCM" not in environment
    assert "off: VLLM_PLUGINS leaves out minimax_m3_kv" in stock
    assert "main KV dtype            bf16 (auto: the model's dtype)" in stock
    assert "minimaxm3_fp8_mi300x.sh" in stock
    assert "  VLLM_ROCM_SHUFFLE_KV_CACHE_LAYOUT=0" in fp8
    assert "indexer dtype            fp8 (e4m3fnuz; vLLM's Triton indexer)" in fp8
    assert "== node self-test: " in fp8
    assert "2.00x the KV tokens (22,656 vs 45,312 bytes/token)" in fp8


@pytest.mark.parametrize(
    ("script", "rocm"), [(MI355X, True), ("minimaxm3_fp8_b300.sh", False)]
)
def test_dry_run_starts_with_todays_public_recipe_then_the_fp8_pool(
    tmp_path, script, rocm
):
    # Each pool's real preflight on MI355X; on B300 what the dry run prints.
    preflight = {} if rocm else NO_PREFLIGHT
    # An operator's AITER variables, as set in many images: the public
    # recipe's pool does not keep them.
    values = inputs(
        tmp_path, KV_PRECISION="compare", VLLM_ROCM_USE_AITER="1", **preflight
    )
    proc = run_script(script, values, "--dry-run")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    runs = sections(proc.stdout)
    assert list(runs) == ["stock", "fp8"]  # the public recipe first: the reference
    serve = {
        pool: next(
            line
            for line in run.splitlines()
            if line.split()[1:2] == ["serve"] and not line.startswith("==")
        )
        for pool, run in runs.items()
    }
    environment = {
        pool: run.split("== ", 2)[2].split("== serve", 1)[0]
        for pool, run in runs.items()
    }
    stock = runs["stock"]
    # Plugin off, no AITER variable, no opt-in, no explicit indexer dtype.
    plugins = next(
        line.split("=", 1)[1]
        for line in environment["stock"].splitlines()
        if line.strip().startswith("VLLM_PLUGINS=")
    )
    assert "minimax_m3_kv" not in plugins.split(",")
    assert "VLLM_ROCM" not in environment["stock"]
    assert "VLLM_MINIMAX_M3_KV_ALLOW_MIXED" not in stock
    assert "--kv-cache-dtype fp8" in serve["stock"]
    # The MI355X recipe leaves the indexer at auto; the B300 one sets fp8.
    assert ("indexer_kv_dtype" in serve["stock"]) is not rocm
    if rocm:
        assert "note: VLLM_ROCM_USE_AITER=1 from your environment is unset" in stock
        assert (
            "InferenceX benchmarks/single_node/fixed_seq_len/minimaxm3_fp8_mi355x.sh"
            in stock
        )
        # The preflight ran stock vLLM's plan: the plugin off, a mixed pool.
        assert "off: VLLM_PLUGINS leaves out minimax_m3_kv" in stock
        # At this workload (ISL 1024, CONC 4) the fp8 pool keeps the public
        # recipe's AITER setting too: the KV pool is all that differs.
        assert "VLLM_ROCM" not in environment["fp8"]
        assert (
            "note: VLLM_ROCM_USE_AITER=1 from your environment is unset"
            in (runs["fp8"])
        )
        assert "uniform precision        yes" in runs["fp8"]
        assert "fp8 (inherited from the KV cache" not in runs["fp8"]
        assert "indexer dtype            fp8 (vLLM's Triton indexer)" in runs["fp8"]
    # Every other flag is the same in both pools: the pool is what differs.
    common = set(serve["stock"].split()) - {"--kv-cache-dtype", "fp8"}
    assert common <= set(serve["fp8"].split())
    assert "--attention-config.indexer_kv_dtype fp8" in serve["fp8"]
    assert "VLLM_MINIMAX_M3_KV_ALLOW_MIXED" not in runs["fp8"]
    assert "agreement probe" in stock and " bench serve " in stock
    assert "== compare report: " in proc.stdout
    assert "dry run: nothing started" in proc.stdout
    assert not (tmp_path / "server.pid").exists()


def test_the_mixed_pool_stays_selectable(tmp_path):
    values = inputs(
        tmp_path, KV_PRECISION="compare", COMPARE_POOLS="mixed fp8", **NO_PREFLIGHT
    )
    proc = run_script(MI355X, values, "--dry-run")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    runs = sections(proc.stdout)
    assert list(runs) == ["mixed", "fp8"]
    assert "VLLM_MINIMAX_M3_KV_ALLOW_MIXED=1" in runs["mixed"]
    assert "  VLLM_ROCM_SHUFFLE_KV_CACHE_LAYOUT=0" in runs["mixed"]


def test_both_healthy_gives_a_table_a_file_and_the_faster_pool(tmp_path):
    pools = {
        "stock": {"output_throughput": 1000.0, "kv_tokens": 2_294_272, "gsm8k": 0.95},
        "fp8": {"output_throughput": 1100.0, "kv_tokens": 3_033_088, "gsm8k": 0.948},
        # The reference served again answers 2 of each 100 RULER prompts
        # differently: the run-to-run noise the report measures.
        "stock-rerun": {"ruler": {"4096": 0.88}},
    }
    proc = compare(tmp_path, pools, ISL="8192", CONC="64", **NO_PREFLIGHT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    # One server per pool, in turn, then the reference again (A/B/A).
    assert len(server_pids(tmp_path)) == 3
    assert "== compare: noise rerun: KV_PRECISION=stock again" in out
    assert_no_server_left(tmp_path)
    assert (
        "  run-to-run noise: stock served again after the other pools disagreed with "
        "its first run on 6 of 300 prompts at 4,096 tokens (2.0%, 95% [0.9%, 4.3%])"
    ) in out
    assert "| stock | 1,000.0 |" in out and "| fp8 | 1,100.0 |" in out
    # The decision says what it was measured against.
    assert (
        "reference: stock (today's public recipe, verbatim, vllm-minimax-m3-kv off)"
        in out
    )
    assert "| 3,033,088 | 0.9480 (0.0060) | 40/40 | 40/40 | 100.0% |" in out
    assert decision(out) == (
        "decision: run KV_PRECISION=fp8: +10.0% output tok/s vs stock; long context"
        " not worse than stock by 2 points (RULER at 4,096 tokens pooled, 600 paired"
        " prompts: drop +0.0 points, one-sided 95% upper bound 0.3 < 2); no harm test"
        " flags (Holm at 0.05 over 5 harm tests); pass-code retrieval intact at 4,096"
        " and 8,176 tokens; gsm8k 0.9480 vs 0.9500 (within 1.96 standard errors;"
        " short context only); first tokens close on 40/40 prompts; 1.32x KV tokens"
    )
    saved = report(tmp_path)
    assert saved["decision"]["run"] == "fp8"
    assert saved["rerun"]["differ"] == 6 and saved["margin"] == 2.0
    assert saved["assessments"]["fp8"]["verdict"] == "shown"
    # The plot beside the report (matplotlib is in the test extras).
    assert f"== plot in {tmp_path / 'results' / 'compare.png'}" in out
    png = (tmp_path / "results" / "compare.png").read_bytes()
    assert png.startswith(b"\x89PNG\r\n\x1a\n") and len(png) > 10_000
    assert [row["pool"] for row in saved["pools"]] == ["stock", "fp8"]
    assert saved["pools"][1]["agreement"]["prompts"] == 40
    for pool in ("stock", "fp8"):
        assert (tmp_path / "results" / pool / "agreement.json").exists()
        assert (tmp_path / "results" / pool / "result.json").exists()


def test_a_slower_fp8_pool_leaves_todays_recipe_in_place(tmp_path):
    pools = {
        "stock": {"output_throughput": 1000.0},
        "fp8": {"output_throughput": 920.0},
    }
    proc = compare(tmp_path, pools, **NO_PREFLIGHT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert decision(proc.stdout).startswith(
        "decision: run KV_PRECISION=stock: fastest (+8.7% output tok/s vs fp8)"
    )
    assert_no_server_left(tmp_path)


def test_a_gsm8k_drop_beyond_its_standard_error_rules_a_pool_out(tmp_path):
    pools = {
        "stock": {"output_throughput": 1000.0, "gsm8k": 0.95, "gsm8k_stderr": 0.006},
        "fp8": {"output_throughput": 1300.0, "gsm8k": 0.92, "gsm8k_stderr": 0.007},
    }
    proc = compare(tmp_path, pools, **NO_PREFLIGHT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "fp8 not eligible: gsm8k 0.9200 vs 0.9500: lower by more than 1.96" in (
        proc.stdout
    )
    assert decision(proc.stdout).startswith("decision: run KV_PRECISION=stock")


def test_long_context_retrieval_decides_where_gsm8k_cannot_see(tmp_path):
    # Equal gsm8k (its prompts are shorter than the indexer keeps); fp8 is
    # worse at the longest length this MAX_MODEL_LEN allows.
    pools = {
        "stock": {"output_throughput": 1000.0, "long_context": {"16384": 0.93}},
        "fp8": {
            "output_throughput": 1300.0,
            "long_context": {"4096": 0.9, "16384": 0.6},
        },
    }
    proc = compare(
        tmp_path, pools, MAX_MODEL_LEN="20000", LONG_EVAL_DOCS="400", **NO_PREFLIGHT
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    assert (
        "long-context retrieval, exact match (stderr), 400 prompts per length, one "
        "pass code among filler records:"
    ) in out
    # The lengths that fit, and the longest that does in place of those that do not.
    assert "| pool | 4,096 tokens | 16,384 tokens | 19,984 tokens |" in out
    assert "| fp8 | 0.90 (0.05) | 0.60 (0.05) | 0.90 (0.05) |" in out
    assert "cannot see the index cache's precision" in out
    # Paired: the same 400 prompts per length, each pool's outcome on each;
    # pass-code retrieval is the breakage guard, outside the tests' alpha.
    assert (
        "    pass-code retrieval at 4,096 tokens (guard): lost 0, gained 0 of 400\n"
        "    pass-code retrieval at 16,384 tokens (guard): lost 132, gained 0 of 400\n"
    ) in out
    assert (
        "fp8 not eligible: pass-code retrieval broken (a net loss over 10 points): "
        "16,384 tokens (lost 132, gained 0 of 400)\n"
    ) in out
    assert decision(out).startswith("decision: run KV_PRECISION=stock")
    saved = report(tmp_path)["pools"]
    built = json.loads(
        (tmp_path / "results" / "fp8" / "long_context" / "lengths.json").read_text()
    )
    assert sorted(built) == [
        "minimax_m3_needles_16384",
        "minimax_m3_needles_19984",
        "minimax_m3_needles_4096",
    ]
    assert saved[1]["long_context"]["16384"]["accuracy"] == 0.6
    assert saved[1]["long_context"]["16384"]["tokens"] == [
        built["minimax_m3_needles_16384"]["tokens_min"],
        built["minimax_m3_needles_16384"]["tokens_max"],
    ]


def test_ruler_and_the_teacher_forced_pass_each_rule_a_pool_out(tmp_path):
    # Pass-code retrieval the same in both; fp8 loses RULER prompts at 16,384
    # only, and 0.05 nats on every token past the indexer's 2,048.
    pools = {
        "stock": {"ruler": {"4096": 0.95, "16384": 0.93}},
        "fp8": {
            "output_throughput": 1300.0,
            "ruler": {"4096": 0.95, "16384": 0.85},
            "logprob_loss": 0.05,
        },
    }
    proc = compare(tmp_path, pools, MAX_MODEL_LEN="20000", **NO_PREFLIGHT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    # 200 prompts per task, three tasks, paired task by task and prompt by
    # prompt: 16 lost in each task at 16,384, none at 4,096.
    assert "    RULER at 4,096 tokens: lost 0, gained 0 of 600, p = 1\n" in out
    # Every harm test that can flag at its size, in one Holm family: RULER per
    # length, per task at the longest, the teacher-forced pass (8 documents).
    assert (
        "fp8 not eligible: long context worse on the same prompts (Holm at 0.05 over "
        "6 harm tests): RULER at 16,384 tokens (lost 48, gained 0 of 600, "
        "p = 3.6e-15); RULER niah_multikey_2 at 16,384 tokens (lost 16, gained 0 of "
        "200, p = 1.5e-05); RULER niah_multikey_3 at 16,384 tokens (lost 16, gained 0 "
        "of 200, p = 1.5e-05); RULER ruler_vt at 16,384 tokens (lost 16, gained 0 of "
        "200, p = 1.5e-05); teacher-forced log-probs at 19,999 tokens (+0.050 nats a "
        "recall token [+0.050, +0.050] over 8 documents, rerun noise 0.000, KL >= "
    ) in out
    assert "pass-code retrieval at 16,384 tokens (" not in out.split("not eligible")[1]
    # Progress after each eval step, with the time left at the measured rate
    # (#64): 200 prompts x 3 tasks x 16,384 tokens at RULER's longest length.
    fp8 = sections(out)["fp8"]
    assert "  done: RULER at 16384 tokens (9,830,400 prompt tokens); evals " in fp8
    done = [line for line in fp8.splitlines() if line.startswith("  done: ")]
    assert [line.split(" (")[0] for line in done] == [
        "  done: long-context retrieval",
        "  done: RULER at 4096 tokens",
        "  done: RULER at 16384 tokens",
        "  done: teacher-forced log-probs",
    ]
    assert all(" min left for " in line for line in done)
    assert done[-1].endswith("min left for 0 more")
    assert decision(out).startswith("decision: run KV_PRECISION=stock")
    saved = report(tmp_path)["pools"]
    assert saved[1]["ruler"]["ruler_vt"]["16384"]["accuracy"] == 0.85
    assert saved[1]["logprobs"]["19999"]["docs"] == 8


def _command(line: str) -> dict[str, str]:
    """A printed command's options, read as the shell reads the line."""
    words = shlex.split(line)
    return {
        word: value
        for word, value in zip(words, [*words[1:], ""], strict=True)
        if word.startswith("--")
    }


@pytest.mark.parametrize(
    ("isl", "conc", "max_model_len", "longest"),
    [("1024", "4", "8192", "8191"), ("8192", "64", "16384", "16383")],
)
@pytest.mark.parametrize(
    ("run_eval", "docs"), [("1", ("30", "200", "32")), ("quick", ("10", "10", "4"))]
)
def test_dry_run_shows_every_long_context_eval_then_gsm8k_for_each_pool(
    tmp_path, isl, conc, max_model_len, longest, run_eval, docs
):
    values = inputs(
        tmp_path, KV_PRECISION="compare", RUN_EVAL=run_eval, ISL=isl, CONC=conc,
        MAX_MODEL_LEN=max_model_len, **NO_PREFLIGHT,
    )  # fmt: skip
    proc = run_script(MI355X, values, "--dry-run")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    needles, ruler, logprobs = docs
    runs = sections(proc.stdout)
    rerun = [] if run_eval == "quick" else ["stock-rerun"]
    assert list(runs) == ["stock", "fp8", *rerun]
    for pool, text in list(runs.items())[:2]:
        evals = text.split("== eval: long context", 1)[1].split("== preflight")[0]
        lines = [line for line in evals.splitlines() if line.startswith("  ")]
        build, lm_eval = _command(lines[1]), _command(lines[2])
        assert "minimaxm3_longctx.py build" in lines[1], (pool, lines)
        assert build["--docs"] == needles
        assert lm_eval["--tasks"].startswith("minimax_m3_needles_4096,")
        # RULER at 4,096 (the standard length that fits), its JSON metadata
        # quoted so that the line runs as printed; the same prompts per pool.
        assert lines[3].startswith("  RULER (multi-key needles, variable tracking)")
        rulers = _command(lines[4])
        assert rulers["--tasks"] == "niah_multikey_2,niah_multikey_3,ruler_vt"
        assert json.loads(rulers["--metadata"]) == {
            "max_seq_lengths": [4096],
            "tokenizer": "MiniMaxAI/MiniMax-M3",
        }
        assert rulers["--limit"] == ruler
        assert rulers["--output_path"].endswith(f"results/{pool}/eval_ruler/4096")
        assert "--log_samples" in rulers
        # The teacher-forced pass at the longest document that fits.
        assert lines[5].startswith("  teacher-forced log-probs")
        scored = _command(lines[6])
        assert "minimaxm3_logprobs.py run" in lines[6]
        assert (scored["--lengths"], scored["--docs"]) == (longest, logprobs)
        assert scored["--out"].endswith(f"results/{pool}/logprobs.json")
        assert lines[7] == "  short-context sanity check:"
        assert _command(lines[8])["--tasks"] == "gsm8k"
        # What the pool will send, step by step, from the lengths that fit.
        plan = text.split("== planned prompt tokens", 1)[1].split("== preflight")[0]
        *lines, budget = [line for line in plan.splitlines()[1:] if line]
        steps = dict(line.strip().split(": ", 1) for line in lines)
        tokens = {name: int(value.replace(",", "")) for name, value in steps.items()}
        assert tokens["bench"] == int(conc) * 10 * int(isl)
        assert tokens["RULER"] == int(ruler) * 3 * 4096
        assert tokens["log-probs"] == int(logprobs) * 2 * int(longest)
        assert tokens["total"] == sum(tokens.values()) - tokens["total"]
        # The evals' hours and GPU-hours at the assumed prefill rate, rounded up.
        evals = tokens["total"] - tokens["bench"]
        tenths = -(-evals * 10 // (20_000 * 3600))
        assert budget == (
            "  evals at EVAL_PREFILL_RATE=20,000 prompt tokens/s (assumed; the run "
            f"prints its measured rate): about {tenths // 10}.{tenths % 10} h, "
            f"{-(-tenths * 8 // 10)} GPU-hours at TP=8"
        )
    # The reference again after the others, RULER at the long length only
    # (here the one that fits), on its first NOISE_EVAL_DOCS prompts a task;
    # RUN_EVAL=quick decides nothing, so it reruns nothing.
    rerun = proc.stdout.split("== compare: noise rerun: KV_PRECISION=stock again")
    report_line = next(
        line
        for line in proc.stdout.splitlines()
        if line.startswith("== compare report")
    )
    if run_eval == "quick":
        assert len(rerun) == 1
        assert report_line.endswith(" --margin 2 --quick stock fp8")
    else:
        rulers = [
            _command(line)
            for line in rerun[1].split("== noise rerun:", 1)[1].splitlines()
            if " --tasks " in line
        ]
        assert [json.loads(r["--metadata"])["max_seq_lengths"] for r in rulers] == [
            [4096]
        ]
        assert rulers[0]["--limit"] == "100"
        assert rulers[0]["--output_path"].endswith(
            "results/stock-rerun/eval_ruler/4096"
        )
        assert "  RULER (the rerun): 1,228,800\n" in rerun[1]
        assert " bench serve " not in rerun[1].split("== compare report")[0]
        assert report_line.endswith(" --margin 2 stock fp8")


def test_a_quick_run_decides_nothing(tmp_path):
    """RUN_EVAL=quick's sizes cannot show a drop under the margin: the faster
    fp8 pool is named on throughput alone and the reference stays."""
    pools = {
        "stock": {"output_throughput": 1000.0},
        "fp8": {"output_throughput": 1100.0},
    }
    proc = compare(tmp_path, pools, RUN_EVAL="quick", **NO_PREFLIGHT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    assert (
        "  fp8 not eligible: RUN_EVAL=quick decides nothing: its evals time the steps "
        "and catch breakage, too few prompts to show a drop under the margin\n"
    ) in out
    assert decision(out) == (
        "decision: run KV_PRECISION=stock: the reference, the only eligible pool; on "
        "throughput alone KV_PRECISION=fp8 is +10.0% output tok/s, its accuracy not "
        "shown (a choice on throughput, not this rule's)"
    )
    assert "noise rerun" not in out
    assert len(server_pids(tmp_path)) == 2


def test_a_context_too_short_to_reach_the_index_cache_is_refused_first(tmp_path):
    values = inputs(
        tmp_path,
        KV_PRECISION="compare",
        RUN_EVAL="1",
        MAX_MODEL_LEN="2000",
        **NO_PREFLIGHT,
    )
    proc = run_script(MI355X, values, "--dry-run")
    assert proc.returncode == 64, proc.stdout + proc.stderr
    assert (
        "long-context eval: no length past the 2,048 tokens the indexer keeps fits "
        "MAX_MODEL_LEN=2000 with 16 tokens to answer"
    ) in proc.stderr
    assert "set MAX_MODEL_LEN=2065 or more (or RUN_EVAL=0)" in proc.stderr
    # The fix runs as printed: the same command with it starts (dry run).
    fixed = run_script(MI355X, {**values, "MAX_MODEL_LEN": "2065"}, "--dry-run")
    assert fixed.returncode == 0, fixed.stdout + fixed.stderr
    assert "--tasks minimax_m3_needles_2049 " in fixed.stdout
    assert "== serve" not in proc.stdout


def test_diverging_greedy_tokens_rule_a_pool_out(tmp_path):
    pools = {"stock": {}, "fp8": {"output_throughput": 1500.0, "diverge": 0.25}}
    proc = compare(tmp_path, pools, **NO_PREFLIGHT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "fp8 not eligible: first tokens not close on" in proc.stdout
    assert decision(proc.stdout).startswith("decision: run KV_PRECISION=stock")
    row = report(tmp_path)["pools"][1]["agreement"]
    assert 0 < row["first_token_close"] < row["prompts"]
    assert row["greedy_tokens_identical"] < 1.0


@pytest.mark.parametrize("step", ["serve", "bench"])
def test_a_pool_that_fails_stops_the_comparison_and_leaves_nothing_running(
    tmp_path, step
):
    pools = {"mixed": {}, "fp8": {"fail": step}, "bf16": {}}
    proc = compare(tmp_path, pools, COMPARE_POOLS="mixed fp8 bf16", **NO_PREFLIGHT)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and errors[0].startswith("error: KV_PRECISION=fp8: "), (
        proc.stderr
    )
    assert "compare stopped at KV_PRECISION=fp8 (exit 1); not run: bf16" in proc.stdout
    assert "bf16" not in sections(proc.stdout)
    assert len(server_pids(tmp_path)) == 2  # mixed, then fp8; bf16 never started
    assert_no_server_left(tmp_path)
    assert not (tmp_path / "results" / "compare.json").exists()


@pytest.mark.parametrize(
    ("pools", "says"),
    [
        ("fp8", "names fewer than two pools"),
        ("fp8 fp8", "names fp8 twice"),
        ("fp8 int8", "COMPARE_POOLS has int8"),
    ],
)
def test_compare_pools_are_checked_before_anything_starts(tmp_path, pools, says):
    proc = run_script(
        MI355X, inputs(tmp_path, KV_PRECISION="compare", COMPARE_POOLS=pools)
    )
    assert proc.returncode == 64
    assert says in proc.stderr
    assert not (tmp_path / "server.pid").exists()


@pytest.mark.parametrize("signal_number", [signal.SIGTERM, signal.SIGHUP])
def test_a_signal_to_the_compare_parent_alone_leaves_nothing_running(
    tmp_path, signal_number
):
    # A job scheduler's cancel: the signal reaches the compare parent only,
    # while its first pool's server is starting (it never gets healthy).
    values = inputs(
        tmp_path,
        KV_PRECISION="compare",
        STANDIN_MODE="hang",
        HEALTH_TIMEOUT_S="120",
        **NO_PREFLIGHT,
    )
    proc = script_process(MI355X, values)
    pidfile = tmp_path / "server.pid"
    deadline = time.time() + 60
    while not (pidfile.exists() and pidfile.read_text().strip()):
        assert proc.poll() is None, proc.communicate()
        assert time.time() < deadline, "no server started"
        time.sleep(0.2)
    started = time.time()
    os.kill(proc.pid, signal_number)
    try:
        out, err = proc.communicate(timeout=45)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise AssertionError("the compare parent did not stop") from None
    assert proc.returncode == 128 + signal_number, (out, err)
    # Stopped, its server gone, well before the 120 s health timeout, and no
    # later pool started.
    assert time.time() - started < 40
    assert len(server_pids(tmp_path)) == 1
    assert_no_server_left(tmp_path)
    assert "KV_PRECISION=fp8" not in out


def test_a_prompt_the_server_refuses_is_named_in_one_error_line(tmp_path):
    proc = compare(tmp_path, {}, STANDIN_REFUSE_OVER="3000", **NO_PREFLIGHT)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    refused = [
        line for line in proc.stderr.splitlines() if "refused by the server" in line
    ]
    assert len(refused) == 1, proc.stderr
    assert refused[0].startswith("prompt records-")
    assert refused[0].endswith(
        "refused by the server: HTTP 400: This model's maximum context length is 8192 tokens."
    )
    assert "error: KV_PRECISION=stock: the agreement probe failed" in proc.stderr
    assert_no_server_left(tmp_path)
