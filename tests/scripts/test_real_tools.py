"""KV_PRECISION=compare with the real tools: the installed vLLM's own `vllm
bench serve` and real lm-eval, against a test server built from vLLM's own
protocol classes (``protocol_server.py``), serving a checkpoint whose
tokenizer is denser than the probe's estimate (one token per character), so
every long-context prompt's length in tokens is its length in characters.
lm-eval's own RULER tasks build their prompts offline with that tokenizer
(``ruler_vt`` is left out: its builder never finishes with one token a
character), and the teacher-forced pass reads vLLM's ``prompt_logprobs``
shape. The fp8 pool's server answers pass codes and RULER questions wrongly
in prompts past 3,100 tokens, and scores prompt tokens past position 3,100
half a nat lower: a model that fails only at long context, which gsm8k
cannot show."""

from __future__ import annotations

import importlib.util
import json
import shutil
import string
from pathlib import Path

import pytest

from tests.scripts.test_launch_scripts import assert_no_server_left, inputs, run_script
from vllm_minimax_m3_kv_sim import REPO

REAL_TOOLS = Path(__file__).parent / "real_tools"
QUESTIONS = [
    # question, answer: the test server answers "#### N", N from the prompt.
    (f"What is {a} plus {b}?", a + b)
    for a, b in [
        (1, 2),
        (2, 2),
        (3, 4),
        (1, 5),
        (2, 6),
        (4, 4),
        (3, 3),
        (0, 7),
        (5, 4),
        (6, 0),
    ]
]
EVAL_TASK = "gsm8k_local"
FP8_RECALLS = 3_100


def char_tokenizer_checkpoint(folder: Path) -> Path:
    """The tiny MiniMax-M3 config with a one-token-per-character tokenizer."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    for char in sorted(set(string.printable)):
        vocab.setdefault(char, len(vocab))
    tokenizer = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tokenizer.decoder = decoders.Fuse()
    folder.mkdir(parents=True)
    tokenizer.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "unk_token": "<unk>",
                "bos_token": "<s>",
                "eos_token": "</s>",
                "model_max_length": 1_000_000,
            }
        )
    )
    shutil.copy(REPO / "tests" / "data" / "minimax_m3_tiny" / "config.json", folder)
    return folder


def gsm8k_format_task(folder: Path) -> Path:
    """A gsm8k-format lm-eval task on a local set (strict match on #### N)."""
    folder.mkdir(parents=True)
    data = folder / "test.jsonl"
    data.write_text(
        "".join(
            json.dumps({"question": q, "answer": f"Work it out.\n#### {a}"}) + "\n"
            for q, a in QUESTIONS
        )
    )
    (folder / f"{EVAL_TASK}.yaml").write_text(
        f"""task: {EVAL_TASK}
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: generate_until
doc_to_text: "Question: {{{{question}}}}\\nAnswer:"
doc_to_target: "{{{{answer}}}}"
metric_list:
  - metric: exact_match
    aggregation: mean
    higher_is_better: true
    ignore_case: true
    ignore_punctuation: false
    regexes_to_ignore: [",", "\\\\$", "(?s).*#### ", "\\\\.$"]
generation_kwargs:
  until: ["Question:", "</s>"]
  do_sample: false
  temperature: 0.0
  max_gen_toks: 16
filter_list:
  - name: strict-match
    filter:
      - function: regex
        regex_pattern: "#### (\\\\-?[0-9\\\\.\\\\,]+)"
      - function: take_first
metadata:
  version: 1.0
"""
    )
    return folder


@pytest.mark.skipif(
    importlib.util.find_spec("lm_eval") is None,
    reason="lm-eval is not installed (pip install 'lm-eval[api]'; CI installs it)",
)
def test_compare_with_real_bench_and_lm_eval_against_vllms_protocol(tmp_path):
    checkpoint = char_tokenizer_checkpoint(tmp_path / "checkpoint")
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    task = gsm8k_format_task(tmp_path / "task")
    values = inputs(
        tmp_path,
        KV_PRECISION="compare",
        RUN_EVAL="1",
        EVAL_TASK=EVAL_TASK,
        EVAL_INCLUDE_PATH=str(task),
        MODEL_PATH=str(checkpoint),
        # Long probe prompts are estimated at 2.5 characters a token; this
        # tokenizer takes one a character, so only /tokenize keeps them in.
        # RULER at 4,096 needs its answer room past it.
        MAX_MODEL_LEN="4400",
        # 8192 does not fit: the longest that does (4384) takes its place.
        # RULER runs at the standard length among them that fits (4096).
        LONG_EVAL_LENGTHS="1024 3000 4096 8192",
        # Enough that the paired rule can flag a test (2^-8 < 0.05 / 8).
        LONG_EVAL_DOCS="8",
        RULER_EVAL_DOCS="8",
        RULER_TASKS="niah_multikey_2 niah_multikey_3",
        # 8192 does not fit: 4399 (the document and one token) does.
        LOGPROB_EVAL_LENGTHS="3000 8192",
        LOGPROB_EVAL_DOCS="8",
        PROTOCOL_SERVER_RECALLS=f"fp8:{FP8_RECALLS}",
        ISL="64",
        OSL="8",
        CONC="2",
        HEALTH_TIMEOUT_S="180",
        CHECK_BIN="true",  # the preflight is tested on its own elsewhere
        HF_DATASETS_OFFLINE="1",
        HF_HUB_OFFLINE="1",
    )
    proc = run_script("minimaxm3_fp8_b300.sh", values, vllm_dir=REAL_TOOLS, timeout=900)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    assert_no_server_left(tmp_path)
    results = tmp_path / "results"
    saved = json.loads((results / "compare.json").read_text())
    rows = {row["pool"]: row for row in saved["pools"]}
    assert list(rows) == ["stock", "fp8"]
    for pool, row in rows.items():
        # The figures are what the real tools wrote: vllm bench serve's result
        # file, lm-eval's results file.
        bench = json.loads((results / pool / "result.json").read_text())
        assert bench["completed"] == 20 and bench["failed"] == 0, bench
        assert row["output_throughput"] == pytest.approx(bench["output_throughput"])
        assert row["median_ttft_ms"] == pytest.approx(bench["median_ttft_ms"])
        (lm_eval_file,) = (results / pool / "eval").glob("**/results_*.json")
        scores = json.loads(lm_eval_file.read_text())["results"][EVAL_TASK]
        assert row["gsm8k"] == pytest.approx(scores["exact_match,strict-match"])
        assert row["gsm8k_stderr"] == pytest.approx(
            scores["exact_match_stderr,strict-match"]
        )
        probe = json.loads((results / pool / "agreement.json").read_text())
        assert len(probe["answers"]) == 40  # none refused for its length
        # Long context: what lm-eval wrote, per length, on prompts whose
        # length the served tokenizer (one token a character) vouches for.
        built = results / pool / "long_context"
        (long_file,) = (results / pool / "eval_long_context").glob("**/results_*.json")
        written = json.loads(long_file.read_text())["results"]
        assert sorted(row["long_context"], key=int) == ["1024", "3000", "4096", "4384"]
        for length, found in row["long_context"].items():
            task = written[f"minimax_m3_needles_{length}"]
            assert found["accuracy"] == pytest.approx(task["exact_match,pass-code"])
            assert found["stderr"] == pytest.approx(
                task["exact_match_stderr,pass-code"]
            )
            prompts = [
                json.loads(line)
                for line in (built / f"minimax_m3_needles_{length}.jsonl")
                .read_text()
                .splitlines()
            ]
            assert len(prompts) == found["docs"] == 8
            # Each prompt's outcome, from the samples real lm-eval logged.
            assert sorted(found["outcomes"], key=int) == [str(i) for i in range(8)]
            assert sum(found["outcomes"].values()) == 8 * found["accuracy"]
            for prompt in prompts:
                text = prompt["prompt"]
                # At most the length, at least 97% of it or two records short.
                record = max(map(len, text.splitlines()))
                assert len(tokenizer.encode(text)) == prompt["tokens"] <= int(length)
                assert prompt["tokens"] >= min(
                    0.97 * int(length), int(length) - 2 * record
                )
                assert f" is {prompt['answer']}.\n" in text
            wrong_past_limit = pool == "fp8" and int(length) > FP8_RECALLS
            assert found["accuracy"] == (0.0 if wrong_past_limit else 1.0), (
                pool,
                length,
            )
        # RULER: lm-eval's own tasks and scorer, 8 prompts a task at 4,096.
        (ruler_file,) = (results / pool / "eval_ruler" / "4096").glob(
            "**/results_*.json"
        )
        ruler_results = json.loads(ruler_file.read_text())["results"]
        assert sorted(row["ruler"]) == ["niah_multikey_2", "niah_multikey_3"]
        for task, found in row["ruler"].items():
            assert found["4096"]["docs"] == 8
            assert found["4096"]["accuracy"] == pytest.approx(
                ruler_results[task]["4096,none"]
            )
            assert found["4096"]["accuracy"] == (0.0 if pool == "fp8" else 1.0)
        # The teacher-forced pass: vLLM's prompt_logprobs shape, read back.
        scored = json.loads((results / pool / "logprobs.json").read_text())
        assert sorted(scored["lengths"], key=int) == ["3000", "4399"]
        for length, docs in scored["lengths"].items():
            assert len(docs) == 8
            for doc in docs:
                # At most the length, at least 97% of it or two records
                # short (a record is at most 85 of this tokenizer's tokens).
                assert doc["tokens"] <= int(length)
                assert doc["tokens"] >= min(0.97 * int(length), int(length) - 170)
                assert len(doc["runs"]) == 2 and doc["runs"][0] == doc["runs"][1]
    assert rows["fp8"]["agreement"]["prompts"] == 40
    # Paired on the same prompts: flagged past the length the server recalls,
    # not below it, in every kind of test; pass-code retrieval, the breakage
    # guard, blocks on its own.
    out = proc.stdout
    assert (
        "fp8 not eligible: pass-code retrieval broken (a net loss over 10 points): "
        "4,096 tokens (lost 8, gained 0 of 8); 4,384 tokens (lost 8, gained 0 of 8)\n"
    ) in out
    tests = {
        line.strip().split(": ", 1)[0]: line
        for line in out.splitlines()
        if line.startswith("    ") and ": " in line
    }
    assert tests["RULER at 4,096 tokens"].endswith(
        "lost 16, gained 0 of 16, p = 1.5e-05 FLAGGED"
    )
    assert tests["teacher-forced log-probs at 4,399 tokens"].endswith(" FLAGGED")
    assert "FLAGGED" not in tests["teacher-forced log-probs at 3,000 tokens"]
    for length in ("1,024", "3,000"):
        assert tests[f"pass-code retrieval at {length} tokens (guard)"].endswith(
            "lost 0, gained 0 of 8"
        )
    # The reference served again: real lm-eval's RULER builds the same first
    # prompts, each answered as before by a deterministic server.
    assert (
        "  run-to-run noise: stock served again after the other pools disagreed "
        "with its first run on 0 of 16 prompts at 4,096 tokens"
    ) in out
    assert "decision: run KV_PRECISION=stock" in out
