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


def _is_paired(row: dict, reference: dict, shared: list[str]) -> bool:
    return all(
        row["long_context"][n].get("outcomes")
        and reference["long_context"][n].get("outcomes")
        for n in shared
    )


def long_context_tests(row: dict, reference: dict) -> dict[str, Any] | None:
    """None when the pools share no long-context result. Else the tests the
    rule ran and those it flags. Paired where both pools logged each
    prompt's outcome: one family, Holm at ALPHA over every test, of the
    pass-code retrieval per length (exact McNemar), RULER per length (its
    tasks' prompts together, exact McNemar) and the teacher-forced log-probs
    per length (sign-flip against the noise floor). Pass-code results without
    per-prompt outcomes fall back to comparing accuracies by ACCURACY_Z
    standard errors ("unpaired")."""
    ours, theirs = row["long_context"], reference["long_context"]
    shared = [n for n in theirs if n in ours]
    if shared and not _is_paired(row, reference, shared):
        lower = [
            n
            for n in shared
            if not _within(
                ours[n]["accuracy"],
                theirs[n]["accuracy"],
                ours[n]["stderr"],
                theirs[n]["stderr"],
            )
        ]
        return {"paired": False, "tests": {}, "lower": lower}
    tests: dict[str, dict[str, Any]] = {}
    for n in shared:
        test = paired_rule.paired(ours[n]["outcomes"], theirs[n]["outcomes"])
        tests[f"retrieval:{n}"] = {"kind": "retrieval", "length": n, **test}
    ruler_lengths = {
        n for lengths in reference.get("ruler", {}).values() for n in lengths
    }
    for n in sorted(ruler_lengths, key=int):
        test = paired_rule.paired(ruler_outcomes(row, n), ruler_outcomes(reference, n))
        if test is not None:
            tests[f"ruler:{n}"] = {"kind": "ruler", "length": n, **test}
    for n, test in sorted((row.get("logprobs") or {}).items(), key=lambda t: int(t[0])):
        tests[f"logprobs:{n}"] = {"kind": "logprobs", "length": n, **test}
    if not tests:
        return None
    for test in tests.values():
        if test["kind"] != "logprobs":
            test["smallest_flagged_drop"] = paired_rule.smallest_flagged_drop(
                test["prompts"], test["gained"], len(tests)
            )
    flagged = paired_rule.holm({name: t["p_value"] for name, t in tests.items()})
    return {
        "paired": True,
        "tests": tests,
        "lower": [name for name in tests if name in flagged],
    }


TEST_NAMES = {
    "retrieval": "pass-code retrieval",
    "ruler": "RULER",
    "logprobs": "teacher-forced log-probs",
}


def _paired_note(test: dict) -> str:
    if test["kind"] == "logprobs":
        low, high = test["loss_interval"] or (test["loss"], test["loss"])
        kl = "" if test["kl"] is None else f", KL >= {test['kl']:.3g}"
        return (
            f"{test['loss']:+.3f} nats a recall token [{low:+.3f}, {high:+.3f}] over "
            f"{test['docs']} documents, noise {test['noise']:.3f}{kl}, "
            f"p = {test['p_value']:.2g}"
        )
    return (
        f"lost {test['lost']}, gained {test['gained']} of {test['prompts']}, "
        f"p = {test['p_value']:.2g}"
    )


def _test_name(test: dict) -> str:
    return f"{TEST_NAMES[test['kind']]} at {int(test['length']):,} tokens"


def _reach(tests: list[dict]) -> str:
    """The smallest drop the run could flag, per kind of test."""
    parts = []
    for kind in ("retrieval", "ruler"):
        drops = [t["smallest_flagged_drop"] for t in tests if t["kind"] == kind]
        if not drops:
            continue
        reach = (
            "none at this size (too few prompts)"
            if any(d is None for d in drops)
            else f"{min(drops):.1f} points"
            if min(drops) == max(drops)
            else f"{min(drops):.1f}-{max(drops):.1f} points"
        )
        parts.append(f"{TEST_NAMES[kind]} {reach}")
    if any(t["kind"] == "logprobs" for t in tests):
        parts.append(
            f"log-probs a loss over the noise floor + {teacher_forced.TOLERANCE_NATS}"
            " nats a recall token"
        )
    return "; ".join(parts)


def decide(rows: list[dict]) -> dict[str, Any]:
    """The rule (docs/deploying.md): the first pool is the reference. A pool
    is eligible when its first greedy token is close to the reference's on
    every probe prompt and, with the evals run, its long-context retrieval at
    every length and its gsm8k are each within ACCURACY_Z standard errors of
    the reference's. Run the eligible pool with the highest output
    throughput."""
    reference = rows[0]
    excluded: dict[str, str] = {}
    for row in rows[1:]:
        match = row.get("agreement")
        if match is None:
            excluded[row["pool"]] = "no agreement probe"
        elif match["first_token_close"] < match["prompts"]:
            excluded[row["pool"]] = (
                f"first tokens not close on {match['prompts'] - match['first_token_close']}"
                f" of {match['prompts']} prompts ({', '.join(match['not_close'][:3])})"
            )
        elif (tested := long_context_tests(row, reference)) and tested["lower"]:
            lower = tested["lower"]
            if tested["paired"]:
                excluded[row["pool"]] = (
                    "long context worse on the same prompts (paired, Holm at "
                    f"{paired_rule.ALPHA} over {len(tested['tests'])} tests): "
                    + "; ".join(
                        f"{_test_name(tested['tests'][name])} "
                        f"({_paired_note(tested['tests'][name])})"
                        for name in lower
                    )
                )
            else:
                excluded[row["pool"]] = "long-context retrieval lower by more than " + (
                    f"{ACCURACY_Z} standard errors at "
                    + ", ".join(
                        f"{int(n):,} tokens ({row['long_context'][n]['accuracy']:.2f} vs "
                        f"{reference['long_context'][n]['accuracy']:.2f})"
                        for n in lower
                    )
                )
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
        lengths = [n for n in reference["long_context"] if n in best["long_context"]]
        tested = long_context_tests(best, reference)
        if tested is None:
            reasons.append(
                "accuracy not measured: RUN_EVAL=1 runs the long-context retrieval "
                "eval (the index cache's evidence) and gsm8k"
            )
        elif tested["paired"]:
            tests = list(tested["tests"].values())
            seen = []
            for kind, name in TEST_NAMES.items():
                at = [int(t["length"]) for t in tests if t["kind"] == kind]
                if at:
                    seen.append(f"{name} at {', '.join(f'{n:,}' for n in at)} tokens")
            reasons.append(
                f"long context not worse on the same prompts: {'; '.join(seen)} "
                f"(paired, Holm at {paired_rule.ALPHA} over {len(tests)} tests; the "
                f"smallest drop this run could flag: {_reach(tests)})"
            )
        else:
            reasons.append(
                f"long-context retrieval within {ACCURACY_Z} standard errors at "
                f"{', '.join(f'{int(n):,}' for n in lengths)} tokens (unpaired: "
                "no per-prompt outcomes)"
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
    verdict = decide(rows)
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
    for row in rows[1:]:
        tested = long_context_tests(row, rows[0])
        if tested and tested["paired"]:
            print(f"  {row['pool']} against {rows[0]['pool']} on the same prompts:")
            for test in tested["tests"].values():
                print(f"    {_test_name(test)}: {_paired_note(test)}")
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
            {"workload": options.workload, "pools": rows, "decision": verdict}, indent=2
        )
    )
    print(f"== comparison in {result_dir / REPORT_FILE}")
    return 0


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
    r.add_argument("pools", nargs="+")
    options = parser.parse_args(argv)
    return probe(options) if options.command == "probe" else report(options)


if __name__ == "__main__":
    sys.exit(main())
