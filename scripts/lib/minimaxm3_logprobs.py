#!/usr/bin/env python3
"""The teacher-forced log-prob pass of KV_PRECISION=compare (standard library
only): the most sensitive signal an operator can take from a served model.

A retrieval task scores an answer right or wrong; here the server scores
every token of a long document it is given (vLLM's ``prompt_logprobs``), so
a pool that attends to the wrong blocks shows as lower log-probs on the
tokens only an earlier block predicts, long before an answer flips.

Each document is a list of parcel records, then a recall section that
repeats records from all through the list: a recalled record's courier and
shelf are predictable only by reading the block that holds it, which is
what the indexer decides (it keeps ``INDEXER_KEEPS`` tokens per query).
Documents are deterministic (their index and length alone, with how many
records fit counted by the served tokenizer).

``run``: against a running server, each document is sent twice, one
request at a time (the rerun shows the server's own noise), and per
document and run it writes the mean log-prob of the recall section's tokens
and, every ``KL_STRIDE`` tokens of it, the top-``TOP`` log-probs.

``compare`` (for the report): per length, the candidate's mean loss per
recall token against the reference, paired by document, with a bootstrap
interval; each pool's rerun difference (reported: the sign-flip test's null
already holds that noise, so it is not added to the margin); a lower bound on
KL(reference || candidate) over the tokens both report; and the p-value of a
sign-flip test that the loss exceeds ``TOLERANCE_NATS``.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
import time
import urllib.error
from collections.abc import Callable
from pathlib import Path
from typing import Any

import minimaxm3_paired as paired_rule
from minimaxm3_longctx import (
    INDEXER_KEEPS,
    add_server_options,
    fitting_lengths,
    post_json,
    server_url,
)

DEFAULT_LENGTHS = (32_768, 65_536, 131_072)
DEFAULT_DOCS = 32
TOP = 5
KL_STRIDE = 16
TOLERANCE_NATS = paired_rule.LOGPROB_MARGIN_NATS
"""A mean loss per recall token below this is not flagged."""
RECALL_SHARE = 0.25
"""The share of a document given to recalling earlier records."""
FILL = 0.97
RESULT_FILE = "logprobs.json"
RUNS = 2

NAMES = ["Ilse Varga", "Tomas Reyes", "Aiko Mori", "Pavel Dun", "Ruth Okafor"]
NAMES += ["Lena Holm", "Omar Haddad", "Kofi Mensah", "Mei Lin", "Sven Aalto"]
LETTERS = "BCDFGHJKLMNPRSTVWXZ"
FAILED_LINE_NATS = math.log(len(LETTERS) * 9000 * len(NAMES) * 90)
"""What a recall line costs when its record was not read (its parcel, courier
and shelf at chance): 18.9 nats spread over the line's tokens, about 0.95
nats a token at 20 tokens a line (the count is the tokenizer's). So
TOLERANCE_NATS a recall token is about 1% of recall lines failed outright."""


def _record(rng: random.Random) -> str:
    return (
        f"parcel {rng.choice(LETTERS)}-{rng.randint(1000, 9999)} "
        f"goes with {rng.choice(NAMES)} to shelf {rng.randint(10, 99)}.\n"
    )


def document(length: int, index: int, records: int) -> tuple[str, str]:
    """Document ``index`` of a length: the records part and the recall part
    (``RECALL_SHARE`` of the records again, drawn from all through the list)."""
    rng = random.Random(f"minimax_m3_logprobs:{length}:{index}")
    lines = [f"Record {i:06d}: {_record(rng)}" for i in range(records)]
    recalled = rng.sample(range(records), max(1, int(records * RECALL_SHARE)))
    head = "Parcel register.\n" + "".join(lines) + "\nRecall, from the register:\n"
    recall = "".join(f"Recall {i:06d}: {lines[i].split(': ', 1)[1]}" for i in recalled)
    return head, recall


def sized_document(
    length: int, index: int, count_tokens: Callable[[str], int]
) -> dict[str, Any]:
    """The document of at most ``length`` tokens (the served tokenizer's
    count) and at least FILL of it (or two records short, where a record is
    more than the band), with where its recall part starts."""
    # A record costs its line and, a RECALL_SHARE of the time, a recall line.
    per_record = count_tokens("".join(document(4_096, 0, 64))) / 64
    low = min(FILL * length, length - 2 * per_record)
    target = (low + length) / 2
    records = max(4, int(target / per_record))
    counted = 0
    tried: set[int] = set()
    for _ in range(64):
        tried.add(records)
        head, recall = document(length, index, records)
        counted = count_tokens(head + recall)
        if low <= counted <= length:
            return {
                "prompt": head + recall,
                "tokens": counted,
                "recall_from": count_tokens(head),
            }
        # Jump by the estimate, then walk a record at a time: which records
        # are recalled changes with the count, so the size is not monotonic.
        step = round((target - counted) / per_record)
        if step == 0 or records + step in tried:
            step = 1 if counted < low else -1
        records = max(4, records + step)
    raise RuntimeError(
        f"could not size document {index} to {int(low)}-{length} tokens "
        f"(last {counted} with {records} records)"
    )


def lengths_that_fit(lengths: list[int], max_model_len: int) -> list[int]:
    """The lengths whose document fits ``--max-model-len`` with the one token
    asked for, past the tokens the indexer keeps (shorter ones cannot see it)."""
    return [
        n
        for n in fitting_lengths(lengths, max_model_len, answer_tokens=1)
        if n > INDEXER_KEEPS
    ]


# -- against the server -----------------------------------------------------


def _post(base_url: str, path: str, body: dict) -> Any:
    # A whole document's prompt log-probs: up to 128K positions to score.
    return post_json(base_url, path, body, timeout=1800)


def scored(
    prompt_logprobs: list[dict[str, dict] | None], token_ids: list[int], start: int
) -> dict[str, Any]:
    """One run of one document, from vLLM's ``prompt_logprobs`` (position i:
    ``{token id: {"logprob", "rank", "decoded_token"}}``, None at 0): the
    mean log-prob of the actual tokens from ``start``, and every KL_STRIDE
    positions the top-TOP log-probs."""
    actual = []
    tops = {}
    for position in range(max(start, 1), len(token_ids)):
        found = prompt_logprobs[position] or {}
        entry = found.get(str(token_ids[position]))
        if entry is None:
            raise ValueError(f"position {position}: the prompt token has no log-prob")
        actual.append(float(entry["logprob"]))
        if (position - start) % KL_STRIDE == 0:
            best = sorted(found.items(), key=lambda item: item[1].get("rank") or 0)
            tops[str(position)] = {
                token: float(value["logprob"])
                for token, value in best
                if (value.get("rank") or TOP + 1) <= TOP
            }
    return {
        "positions": len(actual),
        "mean_logprob": sum(actual) / len(actual) if actual else None,
        "top": tops,
    }


def run(options: argparse.Namespace) -> int:
    base_url = server_url(options)

    def tokenize(prompt: str) -> list[int]:
        # The served tokenizer, as vLLM encodes the completion's prompt.
        reply = _post(base_url, "/tokenize", {"model": options.model, "prompt": prompt})
        return [int(token) for token in reply["tokens"]]

    lengths = lengths_that_fit(options.lengths, options.max_model_len)
    written: dict[str, Any] = {"lengths": {}}
    started = time.monotonic()
    try:
        for length in lengths:
            docs = []
            for index in range(options.docs):
                doc = sized_document(length, index, lambda p: len(tokenize(p)))
                token_ids = tokenize(doc["prompt"])
                start = max(doc["recall_from"], INDEXER_KEEPS)
                runs = []
                for _ in range(RUNS):
                    reply = _post(
                        base_url,
                        "/v1/completions",
                        {
                            "model": options.model,
                            "prompt": doc["prompt"],
                            "max_tokens": 1,
                            "temperature": 0,
                            "prompt_logprobs": TOP,
                        },
                    )
                    choice = reply["choices"][0]
                    runs.append(scored(choice["prompt_logprobs"], token_ids, start))
                docs.append(
                    {"tokens": doc["tokens"], "scored_from": start, "runs": runs}
                )
            written["lengths"][str(length)] = docs
            done = lengths[: lengths.index(length) + 1]
            elapsed = time.monotonic() - started
            left = sum(lengths) - sum(done)
            # The time left at the rate measured so far (prompt tokens a second).
            eta = elapsed / sum(done) * left
            print(
                f"  teacher-forced log-probs: {options.docs} documents of "
                f"{length:,} tokens or fewer, {RUNS} runs each ({elapsed:.0f} s "
                f"so far; about {eta / 60:.0f} min left for {len(lengths) - len(done)} "
                "more lengths)",
                file=sys.stderr,
            )
    except urllib.error.HTTPError as error:
        print(
            f"teacher-forced log-probs: the server refused a request: HTTP "
            f"{error.code}: {error.read()[:300]!r}",
            file=sys.stderr,
        )
        return 1
    except (
        OSError,
        RuntimeError,
        KeyError,
        IndexError,
        TypeError,
        ValueError,
    ) as error:
        print(
            f"teacher-forced log-probs failed: {type(error).__name__}: {error}",
            file=sys.stderr,
        )
        return 1
    written["seconds"] = time.monotonic() - started
    Path(options.out).write_text(json.dumps(written))
    return 0


# -- the report ---------------------------------------------------------------


def coarse_kl(reference: dict[str, float], candidate: dict[str, float]) -> float:
    """KL(reference || candidate) over the tokens both list, the rest of each
    distribution lumped into one outcome: a lower bound on the KL of the
    whole vocabulary (coarse-graining never increases it)."""
    shared = set(reference) & set(candidate)
    p = [math.exp(reference[t]) for t in shared]
    q = [math.exp(candidate[t]) for t in shared]
    p.append(max(0.0, 1.0 - sum(p)))
    q.append(max(0.0, 1.0 - sum(q)))
    return sum(
        a * math.log(a / max(b, 1e-12)) for a, b in zip(p, q, strict=True) if a > 0.0
    )


def _kl_per_doc(ours: dict, theirs: dict) -> float | None:
    positions = sorted(set(ours["top"]) & set(theirs["top"]), key=int)
    if not positions:
        return None
    return sum(coarse_kl(theirs["top"][p], ours["top"][p]) for p in positions) / len(
        positions
    )


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)


def compare(ours: dict, theirs: dict) -> dict[str, dict[str, Any]]:
    """Per length both pools ran: ``loss`` (nats per recall token, the
    candidate's mean log-prob below the reference's, first runs, mean over
    documents) with its bootstrap interval, ``noise`` (the larger pool's own
    mean |run 1 - run 2|, reported only), ``kl`` (lower bound) with its
    interval, and ``p_value`` against TOLERANCE_NATS."""
    found = {}
    for length, their_docs in theirs.get("lengths", {}).items():
        our_docs = ours.get("lengths", {}).get(length)
        if not our_docs:
            continue
        pairs = list(zip(our_docs, their_docs, strict=False))
        losses = [
            t["runs"][0]["mean_logprob"] - o["runs"][0]["mean_logprob"]
            for o, t in pairs
        ]
        noise = max(
            _mean([abs(d["runs"][0]["mean_logprob"] - d["runs"][-1]["mean_logprob"])
                   for d in docs])
            for docs in (our_docs, their_docs)
        )  # fmt: skip
        kls = [
            k
            for o, t in pairs
            if (k := _kl_per_doc(o["runs"][0], t["runs"][0])) is not None
        ]
        margin = TOLERANCE_NATS
        found[length] = {
            "docs": len(pairs),
            "loss": _mean(losses),
            "loss_interval": paired_rule.bootstrap_interval(losses),
            "noise": noise,
            "kl": _mean(kls) if kls else None,
            "kl_interval": paired_rule.bootstrap_interval(kls),
            "margin": margin,
            "p_value": paired_rule.mean_above_p_value(losses, margin),
        }
    return found


def _lengths(text: str) -> list[int]:
    return [int(word) for word in text.replace(",", " ").split()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    sub = commands.add_parser("run")
    add_server_options(sub)
    sub.add_argument("--model", required=True)
    sub.add_argument("--lengths", type=_lengths, required=True)
    sub.add_argument("--max-model-len", type=int, required=True)
    sub.add_argument("--docs", type=int, default=DEFAULT_DOCS)
    sub.add_argument("--out", required=True)
    lengths = commands.add_parser("lengths", help="the lengths that fit, or exit 2")
    lengths.add_argument("--lengths", type=_lengths, required=True)
    lengths.add_argument("--max-model-len", type=int, required=True)
    options = parser.parse_args(argv)
    fit = lengths_that_fit(options.lengths, options.max_model_len)
    if not fit:
        print(
            f"teacher-forced log-probs: no length past the {INDEXER_KEEPS:,} tokens "
            f"the indexer keeps fits MAX_MODEL_LEN={options.max_model_len}",
            file=sys.stderr,
        )
        return 2
    if options.command == "lengths":
        print(" ".join(str(n) for n in fit))
        return 0
    return run(options)


if __name__ == "__main__":
    sys.exit(main())
