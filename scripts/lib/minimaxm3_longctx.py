#!/usr/bin/env python3
"""The long-context retrieval eval for the MiniMax-M3 launch scripts
(standard library only).

gsm8k cannot judge the index cache: MiniMax-M3's indexer keeps the top
``sparse_topk_blocks`` (16) blocks of ``sparse_block_size`` (128) tokens,
2,048 tokens, and a gsm8k prompt is about 1K tokens, so every block is read
whatever the index scores say. This task is built where they decide: one
pass code (the needle) among many filler records, at a controlled depth, at
each context length, asked for at the end and scored by exact match.

``tasks``: the lm-eval task names for the lengths that fit (no server).

``build``: against a running server, write one lm-eval task per length
(``<name>.yaml`` and ``<name>.jsonl``) and ``lengths.json``. Every prompt is
sized with the served tokenizer (vLLM's ``/tokenize``): it holds at most the
length and at least ``FILL`` of it, so a context is what it says.
Deterministic: the records, keys, codes and depths depend on the length and
the document's index alone; only how many filler records fit depends on the
tokenizer.

``scores`` (for the compare report): accuracy and standard error per length
from lm-eval's results files.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import sys
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

TASK_PREFIX = "minimax_m3_needles"
DEFAULT_LENGTHS = (4_096, 16_384, 32_768, 65_536, 131_072)
INDEXER_KEEPS = 16 * 128
"""Tokens the indexer keeps per query: below this every block is read."""
DEPTHS = 10
"""Needle depths per length, evenly from the first record to the last."""
DEFAULT_DOCS = 30
MAX_GEN_TOKENS = 16
FILL = 0.97
LENGTHS_FILE = "lengths.json"
FILTER = "pass-code"
METRIC = "exact_match,pass-code"
STDERR = "exact_match_stderr,pass-code"

STATIONS = ["Tromso", "Arica", "Nuuk", "Hobart", "Ushuaia", "Kiruna", "Iquitos"]
SKIES = ["clear", "overcast", "hazy", "broken", "misty", "bright"]
VAULTS = ["Amber", "Cobalt", "Jade", "Onyx", "Scarlet", "Topaz", "Umber", "Violet"]


def task_name(length: int) -> str:
    return f"{TASK_PREFIX}_{length}"


def fitting_lengths(
    lengths: list[int], max_model_len: int, answer_tokens: int = MAX_GEN_TOKENS
) -> list[int]:
    """The lengths whose prompt and ``answer_tokens`` fit ``--max-model-len``;
    where some do not, the longest that fits takes their place (the eval
    reaches the context the operator serves)."""
    cap = max_model_len - answer_tokens
    kept = {n for n in lengths if n <= cap}
    if len(kept) < len(set(lengths)):
        kept.add(cap)
    return sorted(kept)


def _filler(rng: random.Random, index: int) -> str:
    return (
        f"Log {index:06d}: at station {rng.choice(STATIONS)} the wind was "
        f"{rng.randint(0, 60)} knots and the sky was {rng.choice(SKIES)}.\n"
    )


def _vault(rng: random.Random) -> tuple[str, str]:
    return (
        f"{rng.choice(VAULTS)}-{rng.randint(100, 999)}",
        f"{rng.randint(0, 999_999):06d}",
    )


def _needle(key: str, code: str) -> str:
    return f"The pass code for vault {key} is {code}.\n"


def _question(key: str) -> str:
    return (
        f"\nQuestion: what is the pass code for vault {key}? "
        "Answer with the six digits only.\nAnswer:"
    )


def document(length: int, index: int, records: int) -> dict[str, Any]:
    """Document ``index`` of a length: ``records`` filler records, the asked
    vault's pass code at its depth and three other vaults' elsewhere."""
    rng = random.Random(f"{TASK_PREFIX}:{length}:{index}")
    depth = (index % DEPTHS) / (DEPTHS - 1)
    lines = [_filler(rng, i) for i in range(records)]
    vaults: dict[str, str] = {}
    while len(vaults) < 4:
        key, code = _vault(rng)
        vaults.setdefault(key, code)
    (asked, code), *others = vaults.items()
    for other_key, other_code in others:
        lines.insert(rng.randint(0, len(lines)), _needle(other_key, other_code))
    position = round(depth * len(lines))
    lines.insert(position, _needle(asked, code))
    return {
        "prompt": "".join(lines) + _question(asked),
        "answer": code,
        "depth": depth,
        "length": length,
    }


def sized_document(
    length: int, index: int, count_tokens: Callable[[str], int], per_record: float
) -> dict[str, Any]:
    """The document whose prompt, counted by the served tokenizer, holds at
    most ``length`` tokens and at least FILL of it (or two records fewer,
    where a record is more than the band)."""
    low = min(int(length * FILL), int(length - 2 * per_record))
    target = (low + length) / 2
    records = max(1, int(target / per_record))
    counted = 0
    for _ in range(16):
        doc = document(length, index, records)
        counted = count_tokens(doc["prompt"])
        if low <= counted <= length:
            return {**doc, "tokens": counted}
        step = max(1, math.ceil(abs(target - counted) / per_record))
        records = max(1, records + (step if counted < low else -step))
    raise RuntimeError(
        f"could not size document {index} to {low}-{length} tokens "
        f"(last {counted} with {records} records)"
    )


def _yaml(name: str, data: Path) -> str:
    # The answer is the first six-digit run of the reply, matched exactly.
    return f"""task: {name}
dataset_path: json
dataset_kwargs:
  data_files:
    test: {json.dumps(str(data))}
test_split: test
output_type: generate_until
doc_to_text: "{{{{prompt}}}}"
doc_to_target: "{{{{answer}}}}"
metric_list:
  - metric: exact_match
    aggregation: mean
    higher_is_better: true
generation_kwargs:
  until: ["Question:"]
  do_sample: false
  temperature: 0.0
  max_gen_toks: {MAX_GEN_TOKENS}
filter_list:
  - name: pass-code
    filter:
      - function: regex
        regex_pattern: "([0-9]{{6}})"
      - function: take_first
metadata:
  version: 1.0
"""


def build(
    out_dir: Path,
    lengths: list[int],
    docs: int,
    count_tokens: Callable[[str], int],
) -> dict[str, dict[str, Any]]:
    """Write the tasks; return what ``lengths.json`` records per task."""
    out_dir.mkdir(parents=True, exist_ok=True)
    # Tokens per filler record, measured once on a long sample.
    sample = document(DEFAULT_LENGTHS[0], 0, 200)
    per_record = count_tokens(sample["prompt"]) / 204
    written: dict[str, dict[str, Any]] = {}
    for length in lengths:
        name = task_name(length)
        rows = [
            sized_document(length, index, count_tokens, per_record)
            for index in range(docs)
        ]
        data = (out_dir / f"{name}.jsonl").resolve()
        data.write_text("".join(json.dumps(row) + "\n" for row in rows))
        (out_dir / f"{name}.yaml").write_text(_yaml(name, data))
        counted = [row["tokens"] for row in rows]
        written[name] = {
            "length": length,
            "docs": docs,
            "tokens_min": min(counted),
            "tokens_max": max(counted),
        }
    (out_dir / LENGTHS_FILE).write_text(json.dumps(written, indent=1))
    return written


def add_server_options(parser: argparse.ArgumentParser) -> None:
    """Where the launch script's own server is (the helpers here share it)."""
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", required=True)


def server_url(options: argparse.Namespace) -> str:
    return f"http://{options.host}:{options.port}"


def post_json(base_url: str, path: str, body: dict, timeout: float = 600) -> Any:
    """One JSON request to the served model's API and its JSON reply (the
    helpers here share it)."""
    headers = {"Content-Type": "application/json"}
    if os.environ.get("VLLM_API_KEY"):
        # The key vllm serve was started with (vLLM reads the same variable).
        headers["Authorization"] = f"Bearer {os.environ['VLLM_API_KEY']}"
    request = urllib.request.Request(
        f"{base_url}{path}", data=json.dumps(body).encode(), headers=headers
    )
    with urllib.request.urlopen(request, timeout=timeout) as reply:
        return json.loads(reply.read())


def _tokenizer_of(base_url: str, model: str) -> Callable[[str], int]:
    def count_tokens(prompt: str) -> int:
        # The served tokenizer, as vLLM counts a prompt against max_model_len.
        body = {"model": model, "prompt": prompt}
        return int(post_json(base_url, "/tokenize", body)["count"])

    return count_tokens


def scores(eval_dir: Path, built_dir: Path) -> dict[int, dict[str, Any]]:
    """Per length: lm-eval's accuracy and standard error (newest results file
    that has the task), with the token range the prompts were built to, the
    evaluation's wall time, and each prompt's outcome where lm-eval logged
    its samples (``--log_samples``): what the paired rule compares."""
    built = _read_json(built_dir / LENGTHS_FILE) or {}
    files = sorted(eval_dir.glob("**/results_*.json"), key=lambda p: p.stat().st_mtime)
    found: dict[int, dict[str, Any]] = {}
    for name, facts in built.items():
        for path in reversed(files):
            results = _read_json(path) or {}
            task = (results.get("results") or {}).get(name) or {}
            if METRIC in task:
                found[int(facts["length"])] = {
                    "accuracy": float(task[METRIC]),
                    "stderr": float(task.get(STDERR, 0.0)),
                    "docs": facts["docs"],
                    "tokens": [facts["tokens_min"], facts["tokens_max"]],
                    "seconds": _seconds(results),
                    "outcomes": outcomes(path.parent, name),
                }
                break
    return dict(sorted(found.items()))


def outcomes(results_dir: Path, task: str) -> dict[str, bool] | None:
    """Each prompt's exact match, by lm-eval's ``doc_id``, from the newest
    samples file of ``task`` beside its results file (None: not logged)."""
    files = sorted(
        results_dir.glob(f"samples_{task}_*.jsonl"), key=lambda p: p.stat().st_mtime
    )
    if not files:
        return None
    found = {}
    with files[-1].open(encoding="utf-8") as lines:
        for line in lines:
            sample = json.loads(line)
            if sample.get("filter", FILTER) == FILTER and "exact_match" in sample:
                found[str(sample["doc_id"])] = float(sample["exact_match"]) == 1.0
    return found or None


def _seconds(results: dict[str, Any]) -> float | None:
    try:
        return float(results["total_evaluation_time_seconds"])
    except (KeyError, TypeError, ValueError):
        return None


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _lengths(text: str) -> list[int]:
    return [int(word) for word in text.replace(",", " ").split()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    for command in ("tasks", "build"):
        sub = commands.add_parser(command)
        sub.add_argument("--lengths", type=_lengths, required=True)
        sub.add_argument("--max-model-len", type=int, required=True)
        if command == "build":
            add_server_options(sub)
            sub.add_argument("--model", required=True)
            sub.add_argument("--docs", type=int, default=DEFAULT_DOCS)
            sub.add_argument("--out-dir", type=Path, required=True)
    options = parser.parse_args(argv)
    lengths = fitting_lengths(options.lengths, options.max_model_len)
    if not lengths or max(lengths) <= INDEXER_KEEPS:
        print(
            f"long-context eval: no length past the {INDEXER_KEEPS:,} tokens the "
            f"indexer keeps fits MAX_MODEL_LEN={options.max_model_len} with "
            f"{MAX_GEN_TOKENS} tokens to answer, so it could not see the index "
            f"cache; set MAX_MODEL_LEN={INDEXER_KEEPS + MAX_GEN_TOKENS + 1} or more "
            "(or RUN_EVAL=0)",
            file=sys.stderr,
        )
        return 2
    if options.command == "build":
        count_tokens = _tokenizer_of(server_url(options), options.model)
        try:
            built = build(options.out_dir, lengths, options.docs, count_tokens)
        except (OSError, RuntimeError, KeyError, ValueError) as error:
            # urllib's errors are OSErrors: the server's /tokenize, by name.
            print(
                f"long-context eval: building its prompts failed: "
                f"{type(error).__name__}: {error}",
                file=sys.stderr,
            )
            return 1
        for name, facts in built.items():
            print(
                f"  {name}: {facts['docs']} prompts of {facts['tokens_min']:,}-"
                f"{facts['tokens_max']:,} tokens (served tokenizer)",
                file=sys.stderr,
            )
    print(",".join(task_name(n) for n in lengths))
    return 0


if __name__ == "__main__":
    sys.exit(main())
