"""The long-context evals' own parts, away from a server: RULER's per-prompt
outcomes as lm-eval logs them, the teacher-forced pass's documents and its
paired statistics (the end-to-end runs are in test_real_tools.py)."""

from __future__ import annotations

import json
import math
import random
import sys
from pathlib import Path

import pytest

LIB = Path(__file__).resolve().parents[2] / "scripts" / "lib"
sys.path.insert(0, str(LIB))

import minimaxm3_logprobs as teacher_forced  # noqa: E402
import minimaxm3_paired as rule  # noqa: E402
import minimaxm3_ruler as ruler  # noqa: E402


def _samples(path: Path, length: str, scores: list[float]) -> None:
    # lm-eval's RULER samples: the score under the prompt's length's name,
    # -1 under every other standard length's.
    others = {str(n): -1 for n in ruler.STANDARD_LENGTHS if str(n) != length}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        "".join(
            json.dumps({"doc_id": i, **others, length: score}) + "\n"
            for i, score in enumerate(scores)
        )
    )


def test_a_ruler_prompt_is_right_only_with_every_answer(tmp_path):
    # Variable tracking scores the share of the variables given: half is wrong.
    samples = tmp_path / "4096" / "model" / "samples_ruler_vt_2026.jsonl"
    _samples(samples, "4096", [1.0, 0.5, 0.0, 1.0])
    assert ruler.outcomes(samples) == {"0": True, "1": False, "2": False, "3": True}
    found = ruler.scores(tmp_path)
    assert found == {
        "ruler_vt": {
            "4096": {"accuracy": 0.5, "docs": 4, "outcomes": ruler.outcomes(samples)}
        }
    }


def test_ruler_runs_at_its_standard_lengths_with_room_to_answer():
    assert ruler.lengths_that_fit([4096, 16384, 20000], 16384) == [4096]
    assert ruler.lengths_that_fit([4096, 16384], 16384 + ruler.ANSWER_ROOM) == [
        4096,
        16384,
    ]


def _characters(text: str) -> int:
    return len(text)


@pytest.mark.parametrize("length", [3000, 4399, 32768])
def test_documents_fill_their_length_and_recall_past_what_the_indexer_keeps(length):
    for index in range(8):
        doc = teacher_forced.sized_document(length, index, _characters)
        assert doc["tokens"] == len(doc["prompt"]) <= length
        # At least 97% of the length, or two records short of it.
        assert doc["tokens"] >= min(0.97 * length, length - 2 * 80), index
        assert 0 < doc["recall_from"] < doc["tokens"]
        recalled = doc["prompt"][doc["recall_from"] :].splitlines()
        assert recalled and all(line.startswith("Recall ") for line in recalled)


def _top(dist: list[float]) -> dict[str, float]:
    # What vLLM's prompt_logprobs list: the TOP most likely tokens.
    best = sorted(range(len(dist)), key=lambda i: -dist[i])[: teacher_forced.TOP]
    return {str(i): math.log(dist[i]) for i in best}


def test_the_coarse_kl_is_a_lower_bound_and_zero_for_the_same_distribution():
    draw = random.Random(3)
    for _ in range(50):
        weights = [[draw.random() ** 3 for _ in range(40)] for _ in range(2)]
        p, q = ([w / sum(ws) for w in ws] for ws in weights)
        full = sum(a * math.log(a / b) for a, b in zip(p, q, strict=True))

        coarse = teacher_forced.coarse_kl(_top(p), _top(q))
        assert -1e-12 <= coarse <= full + 1e-12
    assert teacher_forced.coarse_kl(_top(p), _top(p)) == pytest.approx(0.0, abs=1e-12)


def _doc(means: list[float], tops: dict[str, dict[str, float]] | None = None):
    return {
        "tokens": 100,
        "scored_from": 10,
        "runs": [{"mean_logprob": m, "top": tops or {}} for m in means],
    }


def test_the_log_prob_loss_is_judged_against_the_tolerance():
    reference = {"lengths": {"32768": [_doc([-1.0, -1.0]) for _ in range(8)]}}
    worse = {"lengths": {"32768": [_doc([-1.05, -1.05]) for _ in range(8)]}}
    found = teacher_forced.compare(worse, reference)["32768"]
    assert found["loss"] == pytest.approx(0.05)
    assert found["noise"] == 0.0
    assert found["p_value"] == 2**-8  # every document past the tolerance
    # Below the tolerance: not flagged.
    close = {"lengths": {"32768": [_doc([-1.005, -1.005]) for _ in range(8)]}}
    assert teacher_forced.compare(close, reference)["32768"]["p_value"] == 1.0
    # The same loss from a pool whose rerun moves more: the noise is reported,
    # not added to the tolerance (the sign-flip null already holds it).
    noisy = {"lengths": {"32768": [_doc([-1.05, -0.97]) for _ in range(8)]}}
    found = teacher_forced.compare(noisy, reference)["32768"]
    assert found["noise"] == pytest.approx(0.08)
    assert found["p_value"] == 2**-8


def test_the_sign_flip_test_rarely_flags_no_effect_and_mostly_flags_one():
    draw = random.Random(0)

    def flag_rate(shift: float, runs: int = 400) -> float:
        flagged = 0
        for _ in range(runs):
            losses = [0.02 + shift + draw.gauss(0.0, 0.03) for _ in range(10)]
            flagged += rule.mean_above_p_value(losses, 0.02) <= 0.05
        return flagged / runs

    assert flag_rate(0.0) <= 0.07
    assert flag_rate(0.04) >= 0.8


def test_the_bootstrap_interval_holds_the_mean():
    values = [0.1, 0.3, 0.2, 0.5, 0.0, 0.4]
    low, high = rule.bootstrap_interval(values)
    assert low < sum(values) / len(values) < high
    assert rule.bootstrap_interval([0.1]) is None
