#!/usr/bin/env python3
"""KV_PRECISION=compare for the MiniMax-M3 launch scripts (standard library only).

``probe``: send the fixed agreement prompt set to a running server, one request
at a time (greedy, top-5 logprobs), and write what came back.

``report``: read each pool's results (``vllm bench serve``'s result file, the
KV capacity vLLM logged at startup, lm-eval's long-context retrieval, RULER
and gsm8k results, the teacher-forced log-probs, the probe) from
``RESULT_DIR/<pool>/``, print the tables, write ``RESULT_DIR/compare.json``
and end with the pool to run and the rule that chose it (docs/deploying.md).
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
import urllib.error
from collections.abc import Callable
from pathlib import Path
from typing import Any

import minimaxm3_logprobs as teacher_forced
import minimaxm3_paired as paired_rule
import minimaxm3_ruler as ruler
from minimaxm3_longctx import (
    INDEXER_KEEPS,
    add_server_options,
    post_json,
    server_url,
)
from minimaxm3_longctx import scores as long_context_scores

PROBE_FILE = "agreement.json"
SERVER_LOG = "server.log"
REPORT_FILE = "compare.json"
PLOT_FILE = "compare.png"
RERUN_SUFFIX = "-rerun"
"""The reference served again after the other pools (A/B/A): its RULER at
the primary lengths measures run-to-run noise."""
TOP_LOGPROBS = 5
# lm-eval's stderr is one standard error; a drop beyond this many of the
# difference's standard errors (95%, two-sided) is not noise.
ACCURACY_Z = 1.96
LONG_CONTEXT_DIR = "long_context"
LONG_CONTEXT_EVAL_DIR = "eval_long_context"
GSM8K_BLIND = (
    f"gsm8k is a short-context sanity check: its prompts (about 1K tokens) are "
    f"shorter than the {INDEXER_KEEPS:,} tokens the indexer keeps, so every block "
    "is read and it cannot see the index cache's precision"
)
# vLLM logs this once per engine after KV planning ("GPU KV cache size: N
# tokens, ..." from update_kv_cache_capacity in v1/core/kv_cache_utils.py).
KV_TOKENS_LINE = re.compile(r"KV cache size: ([\d,]+) tokens")

# --- the prompt set --------------------------------------------------------

SHORT_PROMPTS = [
    "The capital of France is",
    "Water boils at sea level at a temperature of",
    "The chemical symbol for gold is",
    "Q: What is 17 multiplied by 23?\nA:",
    "Q: If a train travels 60 km in 45 minutes, what is its speed in km/h?\nA:",
    "The three primary colors of light are",
    "def fibonacci(n):\n    ",
    "Translate to German: 'The weather is nice today.'\nGerman:",
    "A haiku about the sea:\n",
    "The largest planet in the solar system is",
    "Q: Name the author of 'Pride and Prejudice'.\nA:",
    "SELECT name, COUNT(*) FROM orders GROUP BY",
]
CITIES = ["Lisbon", "Oslo", "Quito", "Hanoi", "Dakar", "Perth", "Riga", "Lima"]
# Prompt lengths in tokens, each used four times, clipped to what fits: the
# longer ones are past the indexer's 16 x 128 = 2,048 token window, where the
# index cache decides which blocks attention reads.
LONG_TARGETS = [600, 1_500, 3_000, 5_000, 8_000, 12_000, 16_000]
# Digits and punctuation tokenize densely: a conservative characters-per-token.
CHARS_PER_TOKEN = 2.5


def _record(index: int) -> str:
    city = CITIES[index % len(CITIES)]
    code = (index * 7_919 + 12_345) % 90_000 + 10_000
    return (
        f"Entry {index:05d}: the access code for depot {city}-{index % 97} is {code}.\n"
    )


def agreement_prompts(
    max_model_len: int,
    max_tokens: int,
    count_tokens: Callable[[str], int] | None = None,
) -> list[dict[str, Any]]:
    """The fixed prompt set: short completions and long retrieval prompts
    (find one record in a list of many), at least 32, deterministic.

    With ``count_tokens`` (the served tokenizer, through vLLM's /tokenize),
    a prompt longer than ``max_model_len - max_tokens`` loses records until
    it fits; without it, lengths are estimated at CHARS_PER_TOKEN."""
    budget = max(64, max_model_len - max_tokens - 64)
    fits = max_model_len - max_tokens
    prompts = [
        {"id": f"short-{i:02d}", "prompt": p} for i, p in enumerate(SHORT_PROMPTS)
    ]
    for target in LONG_TARGETS:
        tokens = min(target, budget)
        chars = int(tokens * CHARS_PER_TOKEN)
        for variant in range(4):
            lines: list[str] = []
            index = target + variant * 1_000
            while sum(map(len, lines)) + 200 < chars:
                lines.append(_record(index + len(lines)))
            if not lines:
                lines.append(_record(index))
            prompt = _records_prompt(lines, variant)
            while count_tokens is not None and len(lines) > 1:
                counted = count_tokens(prompt)
                if counted <= fits:
                    break
                # Shrink in proportion, a little past it, and count again.
                keep = max(
                    1, min(len(lines) - 1, int(len(lines) * fits / counted * 0.95))
                )
                lines = lines[:keep]
                prompt = _records_prompt(lines, variant)
            prompts.append({"id": f"records-{target}-{variant}", "prompt": prompt})
    return prompts


def _records_prompt(lines: list[str], variant: int) -> str:
    asked = lines[(variant * 2 + 1) * len(lines) // 8]
    depot = asked.split("depot ", 1)[1].split(" is", 1)[0]
    question = f"Question: what is the access code for depot {depot}?\nAnswer:"
    return "".join(lines) + question


# --- probe -----------------------------------------------------------------


def _complete(base_url: str, model: str, prompt: str, max_tokens: int) -> dict:
    body = {
        "model": model,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0,
        "logprobs": TOP_LOGPROBS,
    }
    return _post(base_url, "/v1/completions", body)


def _post(base_url: str, path: str, body: dict) -> dict:
    return post_json(base_url, path, body)


def _refusal(error: urllib.error.HTTPError) -> str:
    """The server's own words for a refused request (vLLM's ErrorResponse)."""
    try:
        body = json.loads(error.read())
        return str(body.get("error", body).get("message", body))
    except (ValueError, AttributeError, OSError):
        return str(error)


def probe(options: argparse.Namespace) -> int:
    base_url = server_url(options)

    def count_tokens(prompt: str) -> int:
        # The served tokenizer, as vLLM counts the prompt against max_model_len.
        return int(
            _post(base_url, "/tokenize", {"model": options.model, "prompt": prompt})[
                "count"
            ]
        )

    answers = []
    try:
        prompts = agreement_prompts(
            options.max_model_len, options.max_tokens, count_tokens
        )
    except (urllib.error.URLError, OSError, KeyError, ValueError) as error:
        print(
            f"agreement probe: the server's /tokenize failed: {error}", file=sys.stderr
        )
        return 1
    for item in prompts:
        try:
            reply = _complete(
                base_url, options.model, item["prompt"], options.max_tokens
            )
            logprobs = reply["choices"][0]["logprobs"]
            answers.append(
                {
                    "id": item["id"],
                    "prompt_chars": len(item["prompt"]),
                    "tokens": logprobs["tokens"],
                    "first_top": logprobs["top_logprobs"][0],
                }
            )
        except urllib.error.HTTPError as error:
            print(
                f"prompt {item['id']} ({len(item['prompt'])} characters) refused by "
                f"the server: HTTP {error.code}: {_refusal(error)}",
                file=sys.stderr,
            )
            return 1
        except (
            urllib.error.URLError,
            OSError,
            KeyError,
            IndexError,
            ValueError,
        ) as error:
            print(
                f"prompt {item['id']}: {type(error).__name__}: {error}", file=sys.stderr
            )
            return 1
    Path(options.out).write_text(
        json.dumps({"max_tokens": options.max_tokens, "answers": answers})
    )
    print(
        f"  agreement probe: {len(answers)} prompts, {options.max_tokens} greedy tokens each"
    )
    return 0


# --- report ----------------------------------------------------------------


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def kv_tokens(server_log: Path) -> int | None:
    """The KV capacity vLLM logged; the smallest where several engines did."""
    try:
        text = server_log.read_text(errors="replace")
    except OSError:
        return None
    found = [int(m.group(1).replace(",", "")) for m in KV_TOKENS_LINE.finditer(text)]
    return min(found) if found else None


def gsm8k(eval_dir: Path, task_name: str = "gsm8k") -> tuple[float, float] | None:
    """lm-eval's gsm8k strict-match score and stderr (newest results file)."""
    files = sorted(eval_dir.glob("**/results_*.json"), key=lambda p: p.stat().st_mtime)
    for path in reversed(files):
        results = (_read_json(path) or {}).get("results") or {}
        task = results.get(task_name) or {}
        if "exact_match,strict-match" in task:
            return (
                float(task["exact_match,strict-match"]),
                float(task.get("exact_match_stderr,strict-match", 0.0)),
            )
    return None


def agreement(reference: dict, other: dict) -> dict[str, Any]:
    """Greedy agreement of ``other`` with ``reference`` on the same prompts.

    ``first_token_close``: per prompt, the first greedy tokens are equal, or
    each is in the other's top-5 (the rule of vLLM's ``check_logprobs_close``).
    ``first_top5_same``: the top-5 tokens and their logprobs rounded to 0.1
    are equal. ``greedy_tokens_identical``: the share of positions whose
    greedy token is the same, over every prompt's generated tokens."""
    ours = {a["id"]: a for a in other["answers"]}
    close = same_top = identical = positions = whole = compared = 0
    far: list[str] = []
    for ref in reference["answers"]:
        answer = ours.get(ref["id"])
        if answer is None:
            continue
        compared += 1
        a, b = ref["tokens"], answer["tokens"]
        if a[:1] == b[:1] or (
            a[:1] and b[:1] and a[0] in answer["first_top"] and b[0] in ref["first_top"]
        ):
            close += 1
        else:
            far.append(ref["id"])
        rounded = [
            sorted((t, round(float(lp), 1)) for t, lp in top.items())
            for top in (ref["first_top"], answer["first_top"])
        ]
        same_top += rounded[0] == rounded[1]
        span = max(len(a), len(b))
        identical += sum(x == y for x, y in zip(a, b, strict=False))
        positions += span
        whole += a == b
    return {
        "prompts": compared,
        "first_token_close": close,
        "first_top5_same": same_top,
        "greedy_tokens_identical": identical / positions if positions else None,
        "prompts_identical": whole,
        "not_close": far,
    }


def pool_row(
    result_dir: Path, pool: str, result_filename: str, eval_task: str = "gsm8k"
) -> dict[str, Any]:
    directory = result_dir / pool
    bench = _read_json(directory / result_filename) or {}
    score = gsm8k(directory / "eval", eval_task)
    long_context = long_context_scores(
        directory / LONG_CONTEXT_EVAL_DIR, directory / LONG_CONTEXT_DIR
    )
    ruler_scores = ruler.scores(directory / ruler.EVAL_DIR)
    needle_seconds = [v["seconds"] for v in long_context.values() if v.get("seconds")]
    scored = _read_json(directory / teacher_forced.RESULT_FILE) or {}
    return {
        "pool": pool,
        "output_throughput": bench.get("output_throughput"),
        "median_ttft_ms": bench.get("median_ttft_ms"),
        "p99_ttft_ms": bench.get("p99_ttft_ms"),
        "median_tpot_ms": bench.get("median_tpot_ms"),
        "p99_tpot_ms": bench.get("p99_tpot_ms"),
        "kv_tokens": kv_tokens(directory / SERVER_LOG),
        "gsm8k": score[0] if score else None,
        "gsm8k_stderr": score[1] if score else None,
        "long_context": {str(n): v for n, v in long_context.items()},
        "ruler": ruler_scores,
        # Each long-context eval's wall time: what its size costs on this node.
        "eval_seconds": {
            "pass-code retrieval": max(needle_seconds) if needle_seconds else None,
            "RULER": ruler.seconds(directory / ruler.EVAL_DIR),
            "teacher-forced log-probs": scored.get("seconds"),
        },
    }


def ruler_outcomes(row: dict, length: str) -> dict[str, bool]:
    """Every RULER task's prompts at one length, as one set (``task:doc``)."""
    return {
        f"{task}:{doc}": right
        for task, lengths in sorted(row.get("ruler", {}).items())
        for doc, right in (lengths.get(length) or {}).get("outcomes", {}).items()
    }


def _within(ours: float, theirs: float, our_se: float, their_se: float) -> bool:
    """``ours`` is not lower than ``theirs`` by more than ACCURACY_Z standard
    errors of the difference."""
    return theirs - ours <= ACCURACY_Z * math.hypot(our_se or 0.0, their_se or 0.0)


def gsm8k_holds(row: dict, reference: dict) -> bool | None:
    """None when either pool has no gsm8k; else whether ``row`` is within
    ACCURACY_Z standard errors of the reference."""
    if row["gsm8k"] is None or reference["gsm8k"] is None:
        return None
    return _within(
        row["gsm8k"],
        reference["gsm8k"],
        row["gsm8k_stderr"],
        reference["gsm8k_stderr"],
    )


def ruler_cells(row: dict, reference: dict) -> dict[str, dict[str, dict[str, int]]]:
    """``{length: {task: counts}}``: each RULER task's prompts at each length,
    paired prompt by prompt with the reference's."""
    cells: dict[str, dict[str, dict[str, int]]] = {}
    for task, lengths in sorted(reference.get("ruler", {}).items()):
        for n, theirs in lengths.items():
            ours = (row.get("ruler", {}).get(task) or {}).get(n)
            found = (
                paired_rule.counts(
                    ours.get("outcomes") or {}, theirs.get("outcomes") or {}
                )
                if ours
                else None
            )
            if found is not None:
                cells.setdefault(n, {})[task] = found
    return dict(sorted(cells.items(), key=lambda item: int(item[0])))


def retrieval_cells(row: dict, reference: dict) -> dict[str, dict[str, int]]:
    """Pass-code retrieval per length, paired where both pools logged each
    prompt's outcome, else counted from the accuracies (the guard only)."""
    cells = {}
    for n, theirs in reference["long_context"].items():
        ours = row["long_context"].get(n)
        if not ours:
            continue
        found = (
            paired_rule.counts(ours["outcomes"], theirs["outcomes"])
            if ours.get("outcomes") and theirs.get("outcomes")
            else None
        )
        if found is None:
            docs = int(theirs.get("docs") or 100)
            net = round((theirs["accuracy"] - ours["accuracy"]) * docs)
            found = {"prompts": docs, "lost": max(net, 0), "gained": max(-net, 0)}
        cells[n] = found
    return cells


def long_context_tests(
    row: dict, reference: dict, margin: float = paired_rule.MARGIN_POINTS
) -> dict[str, Any] | None:
    """The rule (``minimaxm3_paired.assess``) over the evals both pools ran;
    None when they share none."""
    ruler_pairs = ruler_cells(row, reference)
    retrieval = retrieval_cells(row, reference)
    logprobs = row.get("logprobs") or {}
    if not (ruler_pairs or retrieval or logprobs):
        return None
    return paired_rule.assess(ruler_pairs, logprobs, retrieval, margin)


def disagreement(row: dict, reference: dict, lengths: list[int]) -> dict | None:
    """How often two pools' (or two runs') answers differ at ``lengths``."""
    cells = ruler_cells(row, reference)
    found = [c for n in lengths for c in cells.get(str(n), {}).values()]
    prompts = sum(c["prompts"] for c in found)
    if not prompts:
        return None
    differ = sum(c["lost"] + c["gained"] for c in found)
    low, high = paired_rule.wilson_interval(differ, prompts)
    return {"prompts": prompts, "differ": differ, "share": differ / prompts,
            "interval": [low, high]}  # fmt: skip


TEST_NAMES = {
    "retrieval": "pass-code retrieval",
    "ruler": "RULER",
    "ruler task": "RULER",
    "logprobs": "teacher-forced log-probs",
}


def _paired_note(test: dict) -> str:
    if test["kind"] == "logprobs":
        low, high = test["loss_interval"] or (test["loss"], test["loss"])
        kl = "" if test["kl"] is None else f", KL >= {test['kl']:.3g}"
        return (
            f"{test['loss']:+.3f} nats a recall token [{low:+.3f}, {high:+.3f}] over "
            f"{test['docs']} documents, rerun noise {test['noise']:.3f}{kl}, "
            f"p = {test['p_value']:.2g}"
        )
    return (
        f"lost {test['lost']}, gained {test['gained']} of {test['prompts']}, "
        f"p = {test['p_value']:.2g}"
    )


def _test_name(test: dict) -> str:
    task = f" {test['task']}" if test.get("task") else ""
    return f"{TEST_NAMES[test['kind']]}{task} at {int(test['length']):,} tokens"


def _lengths_text(lengths: list[int]) -> str:
    return " and ".join(f"{n:,}" for n in lengths) + " tokens"


def _primary_text(primary: dict) -> str:
    return (
        f"RULER at {_lengths_text(primary['lengths'])} pooled, "
        f"{primary['prompts']:,} paired prompts: drop {primary['drop']:+.1f} points, "
        f"one-sided {paired_rule.CONFIDENCE:.0%} upper bound {primary['upper']:.1f}"
    )


def _family_text(tested: dict) -> str:
    tests = tested["tests"]
    left_out = [n for n in tests if n not in tested["family"]]
    text = f"Holm at {paired_rule.ALPHA} over {len(tested['family'])} harm tests"
    if left_out:
        text += "; unable to flag at their size: " + ", ".join(
            f"{_test_name(tests[n])} ({tests[n].get('docs', tests[n].get('prompts'))}"
            f" {'documents' if tests[n]['kind'] == 'logprobs' else 'prompts'})"
            for n in left_out
        )
    return text


def _not_shown(tested: dict, pair_noise: dict | None, rerun: dict | None) -> str:
    primary = tested["primary"]
    if primary is None:
        return (
            "long-context accuracy not shown: no RULER length both pools ran "
            "(the primary test's evidence)"
        )
    observed = [n["share"] for n in (pair_noise, rerun) if n]
    share = max(observed) if observed else 0.0
    needed = paired_rule.prompts_needed(max(share, 1 / primary["prompts"]))
    return (
        f"long-context accuracy not shown within {primary['margin']:g} points at this "
        f"size ({_primary_text(primary)} >= {primary['margin']:g}); at the "
        f"{share:.1%} of prompts the runs disagreed on, about {needed:,} paired "
        f"prompts at those lengths show it for a pool with no effect in "
        f"{paired_rule.TARGET_POWER:.0%} of runs"
    )


def decide(
    rows: list[dict],
    margin: float = paired_rule.MARGIN_POINTS,
    quick: bool = False,
    rerun: dict | None = None,
) -> dict[str, Any]:
    """The rule (docs/deploying.md): the first pool is the reference. A
    candidate is eligible when its first greedy token is close to the
    reference's on every probe prompt, its long-context accuracy is shown
    non-inferior by ``margin`` points with no secondary test or guard
    blocking (``minimaxm3_paired``), and its gsm8k is within ACCURACY_Z
    standard errors. Run the eligible pool with the highest output
    throughput; a faster pool left out for want of evidence is named, on
    throughput alone."""
    reference = rows[0]
    excluded: dict[str, str] = {}
    unproven: list[dict] = []
    for row in rows[1:]:
        match = row.get("agreement")
        tested = long_context_tests(row, reference, margin)
        if match is None:
            excluded[row["pool"]] = "no agreement probe"
        elif match["first_token_close"] < match["prompts"]:
            excluded[row["pool"]] = (
                f"first tokens not close on {match['prompts'] - match['first_token_close']}"
                f" of {match['prompts']} prompts ({', '.join(match['not_close'][:3])})"
            )
        elif quick:
            excluded[row["pool"]] = (
                "RUN_EVAL=quick decides nothing: its evals time the steps and "
                "catch breakage, too few prompts to show a drop under the margin"
            )
            unproven.append(row)
        elif tested is None:
            excluded[row["pool"]] = (
                "long-context accuracy not measured: RUN_EVAL=1 runs the long-context "
                "evals (the index cache's evidence)"
            )
            unproven.append(row)
        elif tested["verdict"] == "broken":
            excluded[row["pool"]] = "pass-code retrieval broken (a net loss over " + (
                f"{paired_rule.GUARD_POINTS:g} points): "
                + "; ".join(
                    f"{int(n):,} tokens (lost {tested['guard'][n]['lost']}, gained "
                    f"{tested['guard'][n]['gained']} of {tested['guard'][n]['prompts']})"
                    for n in tested["broken"]
                )
            )
        elif tested["verdict"] == "worse":
            excluded[row["pool"]] = (
                f"long context worse on the same prompts ({_family_text(tested)}): "
                + "; ".join(
                    f"{_test_name(tested['tests'][name])} "
                    f"({_paired_note(tested['tests'][name])})"
                    for name in tested["flagged"]
                )
            )
        elif tested["verdict"] == "not shown":
            pair = (
                disagreement(row, reference, tested["primary"]["lengths"])
                if (tested["primary"])
                else None
            )
            excluded[row["pool"]] = _not_shown(tested, pair, rerun)
            unproven.append(row)
        elif gsm8k_holds(row, reference) is False:
            excluded[row["pool"]] = (
                f"gsm8k {row['gsm8k']:.4f} vs {reference['gsm8k']:.4f}: lower by more than"
                f" {ACCURACY_Z} standard errors"
            )
        elif row["output_throughput"] is None:
            excluded[row["pool"]] = "no benchmark result"
    eligible = [r for r in rows if r["pool"] not in excluded]
    best = max(eligible, key=lambda r: r["output_throughput"] or 0.0)
    reasons: list[str] = []
    if best is not reference and reference["output_throughput"]:
        gain = best["output_throughput"] / reference["output_throughput"] - 1
        reasons.append(f"{gain:+.1%} output tok/s vs {reference['pool']}")
    elif len(eligible) > 1:
        others = [r for r in eligible if r is not best and r["output_throughput"]]
        if others and best["output_throughput"]:
            runner = max(others, key=lambda r: r["output_throughput"])
            gain = best["output_throughput"] / runner["output_throughput"] - 1
            reasons.append(f"fastest ({gain:+.1%} output tok/s vs {runner['pool']})")
    else:
        reasons.append("the reference, the only eligible pool")
    if best is not reference:
        tested = long_context_tests(best, reference, margin)
        primary = tested["primary"]
        reasons.append(
            f"long context not worse than {reference['pool']} by {margin:g} points "
            f"({_primary_text(primary)} < {margin:g}); no harm test flags "
            f"({_family_text(tested)})"
        )
        if tested["guard"]:
            reasons.append(
                "pass-code retrieval intact at "
                + _lengths_text([int(n) for n in tested["guard"]])
            )
        if gsm8k_holds(best, reference) is not None:
            reasons.append(
                f"gsm8k {best['gsm8k']:.4f} vs {reference['gsm8k']:.4f} (within"
                f" {ACCURACY_Z} standard errors; short context only)"
            )
        match = best["agreement"]
        reasons.append(
            f"first tokens close on {match['first_token_close']}/{match['prompts']} prompts"
        )
    if best["kv_tokens"] and reference["kv_tokens"] and best is not reference:
        reasons.append(f"{best['kv_tokens'] / reference['kv_tokens']:.2f}x KV tokens")
    faster = [
        r
        for r in unproven
        if r["output_throughput"]
        and best["output_throughput"]
        and r["output_throughput"] > best["output_throughput"]
    ]
    if faster:
        fastest = max(faster, key=lambda r: r["output_throughput"])
        gain = fastest["output_throughput"] / best["output_throughput"] - 1
        reasons.append(
            f"on throughput alone KV_PRECISION={fastest['pool']} is {gain:+.1%} output "
            f"tok/s, its accuracy not shown (a choice on throughput, not this rule's)"
        )
    return {"run": best["pool"], "reasons": reasons, "excluded": excluded}


def _cell(value: Any, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def table(rows: list[dict]) -> str:
    header = (
        "| pool | output tok/s | TTFT median / p99 ms | TPOT median / p99 ms | KV tokens"
        " | gsm8k (stderr) | first token close | top-5 same | greedy tokens same |"
    )
    lines = [header, "|" + "---|" * header.count(" | ") + "---|"]
    for row in rows:
        match = row.get("agreement")
        gsm = (
            f"{row['gsm8k']:.4f} ({row['gsm8k_stderr']:.4f})"
            if row["gsm8k"] is not None
            else "-"
        )
        agree = (
            [
                f"{match['first_token_close']}/{match['prompts']}",
                f"{match['first_top5_same']}/{match['prompts']}",
                _cell(match["greedy_tokens_identical"], ".1%"),
            ]
            if match
            else ["reference"] * 3
        )
        lines.append(
            f"| {row['pool']} | {_cell(row['output_throughput'], ',.1f')}"
            f" | {_cell(row['median_ttft_ms'], ',.1f')} / {_cell(row['p99_ttft_ms'], ',.1f')}"
            f" | {_cell(row['median_tpot_ms'], '.2f')} / {_cell(row['p99_tpot_ms'], '.2f')}"
            f" | {_cell(row['kv_tokens'], ',')} | {gsm} | {' | '.join(agree)} |"
        )
    return "\n".join(lines)


def ruler_table(rows: list[dict]) -> str | None:
    """RULER accuracy per task and length, one row per pool and task."""
    cells = {
        (row["pool"], task, length): found
        for row in rows
        for task, lengths in row.get("ruler", {}).items()
        for length, found in lengths.items()
    }
    if not cells:
        return None
    lengths = sorted({int(length) for _, _, length in cells})
    tasks = sorted({task for _, task, _ in cells})
    header = "| pool | task | " + " | ".join(f"{n:,} tokens" for n in lengths) + " |"
    lines = [header, "|---|---|" + "---|" * len(lengths)]
    for row in rows:
        for task in tasks:
            found = [cells.get((row["pool"], task, str(n))) for n in lengths]
            if any(found):
                lines.append(
                    f"| {row['pool']} | {task} | "
                    + " | ".join(
                        f"{f['accuracy']:.3f} ({f['docs']})" if f else "-"
                        for f in found
                    )
                    + " |"
                )
    return "\n".join(lines)


def long_context_table(rows: list[dict]) -> str | None:
    """Retrieval accuracy (stderr) per context length, one row per pool."""
    lengths = sorted({int(n) for row in rows for n in row["long_context"]})
    if not lengths:
        return None
    header = "| pool | " + " | ".join(f"{n:,} tokens" for n in lengths) + " |"
    lines = [header, "|---|" + "---|" * len(lengths)]
    for row in rows:
        cells = []
        for n in lengths:
            found = row["long_context"].get(str(n))
            cells.append(
                f"{found['accuracy']:.2f} ({found['stderr']:.2f})" if found else "-"
            )
        lines.append(f"| {row['pool']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


POOL_MEANINGS = {
    "stock": " (today's public recipe, verbatim, vllm-minimax-m3-kv off)",
    "mixed": " (fp8 KV beside a bf16 indexer, every block zeroed)",
}


def eval_cost(rows: list[dict], workload: str) -> list[str]:
    """Per pool, each long-context eval's wall time and, at the workload's
    tensor-parallel size, the GPU-minutes the run's size cost."""
    tp = re.search(r"\bTP=(\d+)", workload)
    gpus = int(tp.group(1)) if tp else None
    lines = []
    for row in rows:
        spent = {k: v for k, v in row.get("eval_seconds", {}).items() if v}
        if not spent:
            continue
        minutes = sum(spent.values()) / 60
        parts = ", ".join(f"{name} {v / 60:.1f}" for name, v in spent.items())
        cost = f", {minutes * gpus:.0f} GPU-minutes at TP={gpus}" if gpus else ""
        lines.append(
            f"long-context eval wall time, {row['pool']}: {minutes:.1f} min "
            f"({parts}){cost}"
        )
    return lines


def report(options: argparse.Namespace) -> int:
    result_dir = Path(options.result_dir)
    rows = [
        pool_row(result_dir, pool, options.result_filename, options.eval_task)
        for pool in options.pools
    ]
    reference_probe = _read_json(result_dir / options.pools[0] / PROBE_FILE)
    reference_logprobs = _read_json(
        result_dir / options.pools[0] / teacher_forced.RESULT_FILE
    )
    for row in rows[1:]:
        ours = _read_json(result_dir / row["pool"] / teacher_forced.RESULT_FILE)
        # The per-length comparison, not the raw log-probs (tens of MB).
        row["logprobs"] = (
            teacher_forced.compare(ours, reference_logprobs)
            if ours and reference_logprobs
            else {}
        )
        probe_result = _read_json(result_dir / row["pool"] / PROBE_FILE)
        row["agreement"] = (
            agreement(reference_probe, probe_result)
            if reference_probe and probe_result
            else None
        )
    margin = options.margin
    rerun = None
    rerun_dir = result_dir / f"{options.pools[0]}{RERUN_SUFFIX}"
    if rerun_dir.is_dir():
        again = {
            "pool": rerun_dir.name,
            "ruler": ruler.scores(rerun_dir / ruler.EVAL_DIR),
        }
        lengths = [int(n) for n in ruler_cells(again, rows[0])]
        if lengths:
            rerun = disagreement(again, rows[0], paired_rule.primary_lengths(lengths))
            if rerun is not None:
                rerun["lengths"] = paired_rule.primary_lengths(lengths)
    verdict = decide(rows, margin, options.quick, rerun)
    reference = options.pools[0]
    print(
        f"== compare ({options.workload}); reference: {reference}"
        f"{POOL_MEANINGS.get(reference, '')}"
    )
    print(table(rows))
    long_table = long_context_table(rows)
    if long_table is not None:
        docs = next(iter(rows[0]["long_context"].values()), {}).get("docs")
        print(
            "long-context retrieval, exact match (stderr), "
            f"{docs} prompts per length, one pass code among filler records:"
        )
        print(long_table)
    ruler_lines = ruler_table(rows)
    if ruler_lines is not None:
        print(
            "RULER (lm-eval), share of prompts fully right, per task and length "
            "(prompts):"
        )
        print(ruler_lines)
    if rerun is not None:
        low, high = rerun["interval"]
        print(
            f"  run-to-run noise: {reference} served again after the other pools "
            f"disagreed with its first run on {rerun['differ']} of {rerun['prompts']} "
            f"prompts at {_lengths_text(rerun['lengths'])} ({rerun['share']:.1%}, "
            f"95% [{low:.1%}, {high:.1%}])"
        )
    for row in rows[1:]:
        tested = long_context_tests(row, rows[0], margin)
        if not tested:
            continue
        print(f"  {row['pool']} against {rows[0]['pool']} on the same prompts:")
        primary = tested["primary"]
        if primary is not None:
            pair = disagreement(row, rows[0], primary["lengths"])
            print(
                f"    primary, non-inferiority by {margin:g} points: "
                f"{_primary_text(primary)} ({'<' if primary['shown'] else '>='} "
                f"{margin:g}: {'shown' if primary['shown'] else 'not shown'}); the "
                f"pools disagreed on {pair['share']:.1%} of those prompts"
            )
        for name, test in tested["tests"].items():
            role = "" if name in tested["family"] else " (cannot flag at this size)"
            flag = " FLAGGED" if name in tested["flagged"] else ""
            print(f"    {_test_name(test)}: {_paired_note(test)}{role}{flag}")
        for n, found in tested["guard"].items():
            print(
                f"    pass-code retrieval at {int(n):,} tokens (guard): lost "
                f"{found['lost']}, gained {found['gained']} of {found['prompts']}"
            )
    for line in eval_cost(rows, options.workload):
        print(f"  {line}")
    if any(row["gsm8k"] is not None for row in rows):
        print(f"  ({GSM8K_BLIND})")
    for pool, why in verdict["excluded"].items():
        print(f"  {pool} not eligible: {why}")
    print(
        f"decision: run KV_PRECISION={verdict['run']}: {'; '.join(verdict['reasons'])}"
    )
    if reference == "stock":
        print("  (stock: what you run today, the public recipe with the plugin off)")
    (result_dir / REPORT_FILE).write_text(
        json.dumps(
            {
                "workload": options.workload,
                "margin": margin,
                "quick": options.quick,
                "rerun": rerun,
                "pools": rows,
                "assessments": {
                    row["pool"]: long_context_tests(row, rows[0], margin)
                    for row in rows[1:]
                },
                "decision": verdict,
            },
            indent=2,
        )
    )
    print(f"== comparison in {result_dir / REPORT_FILE}")
    print(f"== {plot(rows, result_dir / PLOT_FILE)}")
    return 0


def ruler_by_length(row: dict) -> dict[int, tuple[int, int]]:
    """RULER prompts right and run per length, every task together."""
    found: dict[int, tuple[int, int]] = {}
    for lengths in row.get("ruler", {}).values():
        for n, cell in lengths.items():
            outcomes = cell.get("outcomes")
            right, total = (
                (sum(outcomes.values()), len(outcomes))
                if outcomes
                else (round(cell["accuracy"] * cell["docs"]), cell["docs"])
            )
            before = found.get(int(n), (0, 0))
            found[int(n)] = (before[0] + right, before[1] + total)
    return dict(sorted(found.items()))


def plot(rows: list[dict], path: Path) -> str:
    """RULER accuracy by length per pool (Wilson 95% intervals, tasks pooled)
    beside each pool's output throughput, as a PNG: where it went, or why not
    (matplotlib is optional)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return f"plot not drawn: pip install matplotlib to get {path.name}"
    figure, (accuracy, speed) = plt.subplots(1, 2, figsize=(11, 4))
    for offset, row in enumerate(rows):
        cells = ruler_by_length(row)
        if not cells:
            continue
        xs = [n * (1 + 0.03 * offset) for n in cells]
        ys = [right / total for right, total in cells.values()]
        bounds = [paired_rule.wilson_interval(*cell) for cell in cells.values()]
        accuracy.errorbar(
            xs, ys, capsize=3, marker="o", label=row["pool"],
            yerr=[[y - low for y, (low, _) in zip(ys, bounds, strict=True)],
                  [high - y for y, (_, high) in zip(ys, bounds, strict=True)]],
        )  # fmt: skip
    accuracy.set_xscale("log", base=2)
    accuracy.set_xlabel("prompt length (tokens)")
    accuracy.set_ylabel("RULER, share right (95% interval)")
    accuracy.legend()
    pools = [row["pool"] for row in rows]
    speed.bar(pools, [row["output_throughput"] or 0.0 for row in rows])
    speed.set_ylabel("output tok/s")
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return f"plot in {path}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    p = commands.add_parser("probe")
    add_server_options(p)
    p.add_argument("--model", required=True)
    p.add_argument("--max-model-len", type=int, required=True)
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--out", required=True)
    r = commands.add_parser("report")
    r.add_argument("--result-dir", required=True)
    r.add_argument("--result-filename", required=True)
    r.add_argument("--workload", default="")
    r.add_argument("--eval-task", default="gsm8k", help="lm-eval task to read")
    r.add_argument(
        "--margin", type=float, default=paired_rule.MARGIN_POINTS,
        help="non-inferiority margin in points of long-context accuracy",
    )  # fmt: skip
    r.add_argument(
        "--quick", action="store_true",
        help="the evals ran at RUN_EVAL=quick's sizes: decide nothing on them",
    )  # fmt: skip
    r.add_argument("pools", nargs="+")
    options = parser.parse_args(argv)
    return probe(options) if options.command == "probe" else report(options)


if __name__ == "__main__":
    sys.exit(main())
