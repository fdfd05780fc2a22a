"""The node self-test's judge and inputs, without a kernel: what it must
refuse (non-finite scores, impossible top-k rows) and why its bytes make a
writer/reader flavour mismatch visible, or harmless where it cannot be seen.

The outputs judged here are made from the judge's own fp64 reference (what a
perfect scorer returns), then broken one way each; the kernels themselves
run in ``test_rocm_fp8_triton_indexer.py``.
"""

from __future__ import annotations

import math

import pytest

from vllm_minimax_m3_kv.selftest import (
    E4M3FN,
    E4M3FNUZ,
    PLANTED_TOKEN,
    SPARSE_BLOCK,
    Case,
    e4m3,
    make_inputs,
)
from vllm_minimax_m3_kv.selftest_judge import TOPK_OUTPUTS, judge, references

CASE = Case()
# torch is imported in each test, not at collection: the fast tier, which
# collects this module too, imports no torch.


def _stored(fmt=E4M3FN) -> dict:
    return {name: e4m3(value, fmt) for name, value in make_inputs(CASE).items()}


@pytest.fixture(scope="module")
def refs() -> dict:
    return references(CASE, _stored())


def _perfect(refs: dict) -> dict:
    """What a scorer that computed fp64 exactly would return."""
    import torch

    outputs = {"prefill_score": refs["prefill_score"].float()}
    for name in TOPK_OUTPUTS:
        rows = [
            sorted(want.blocks) + [-1] * (CASE.topk - len(want.blocks))
            for want in refs[name]
        ]
        outputs[name] = torch.tensor(rows, dtype=torch.int32)[None]
    return outputs


def test_a_perfect_scorer_passes(refs):
    result = judge(CASE, _perfect(refs), refs)
    assert result.passed, result.failures
    assert result.record["score_error"] < 1e-4  # fp32 rounding of fp64


def _lowest_visible_block_is(refs: dict, value: float) -> dict:
    outputs = _perfect(refs)
    outputs["prefill_score"][0, 0, 0] = value
    return outputs


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_a_non_finite_score_fails_by_name(refs, value):
    # NaN compares false with every bound: "off by more than the bound"
    # alone passed it (score_error=nan, passed=True).
    result = judge(CASE, _lowest_visible_block_is(refs, value), refs)
    assert not result.passed
    assert result.failures[0].startswith("prefill scores: 1 of 168 not finite")
    assert result.record["score_error"] == math.inf


def test_every_score_nan_fails(refs):
    outputs = _perfect(refs)
    outputs["prefill_score"][:] = math.nan
    result = judge(CASE, outputs, refs)
    assert not result.passed
    assert "(168 NaN)" in result.failures[0]


def test_a_block_past_what_the_query_sees_fails(refs):
    outputs = _perfect(refs)
    row = outputs["decode_topk_q1"][0, 0]
    row[-1] = 10_000
    result = judge(CASE, outputs, refs)
    assert "decode_topk_q1 row 0: picked blocks [10000], past the" in result.failures[0]


def test_a_block_picked_twice_fails(refs):
    outputs = _perfect(refs)
    row = outputs["prefill_topk"][0, 2]
    row[1] = row[0]
    result = judge(CASE, outputs, refs)
    assert "prefill_topk row 2: a block picked twice" in result.failures


def test_a_row_read_from_another_requests_table_fails(refs):
    # Decode request 1 answered with request 0's blocks (a kernel reading
    # one table for every request): other sequences, other blocks.
    outputs = _perfect(refs)
    outputs["decode_topk_q1"][0, 1] = outputs["decode_topk_q1"][0, 0]
    result = judge(CASE, outputs, refs)
    assert [f.split(":")[0] for f in result.failures] == ["decode_topk_q1 row 1"]


def test_the_batch_is_shaped_like_serving():
    lengths = CASE.lengths
    assert len(set(lengths)) == len(lengths) >= 3
    tails = {length % SPARSE_BLOCK for length in lengths}
    assert 0 in tails and SPARSE_BLOCK - 1 in tails and len(tails) >= 3
    # Several prefill requests; decode requests on distinct sequences.
    assert len(CASE.prefill) >= 2 and len(set(CASE.decode)) == len(CASE.decode)
    planted = [set(CASE.planted_in(s)) for s in range(len(lengths))]
    assert all(a != b for i, a in enumerate(planted) for b in planted[i + 1 :])


def test_every_query_and_planted_key_carries_e4m3fns_0x80():
    import torch

    # A reader that takes e4m3fn bytes for e4m3fnuz reads 0x80 as NaN: every
    # query row and the first planted key of every sequence then scores NaN.
    stored = _stored(E4M3FN)
    for name in ("prefill_q", "decode_q"):
        as_fnuz = stored[name].view(torch.uint8).view(torch.float8_e4m3fnuz)
        assert as_fnuz.float().isnan().any(dim=1).all(), name
    keys = stored["keys"].view(torch.uint8)
    for sequence in range(len(CASE.lengths)):
        block = CASE.first_block(sequence) + CASE.planted_in(sequence)[0]
        assert keys[block * SPARSE_BLOCK + PLANTED_TOKEN, 0] == 0x80


@pytest.mark.parametrize("fmt", [E4M3FN, E4M3FNUZ], ids=["e4m3fn", "e4m3fnuz"])
def test_both_exponent_extremes_are_stored(fmt):
    import torch

    keys = _stored(fmt)["keys"].view(torch.uint8)
    largest = e4m3(torch.tensor([fmt.max, -fmt.max]), fmt)
    for byte in [*largest.view(torch.uint8).tolist(), 0x01, 0x81]:
        assert (keys == byte).any(), hex(byte)


def test_fnuz_bytes_read_as_e4m3fn_are_exactly_twice_their_value():
    import torch

    # Why the reverse mismatch cannot reach serving: for every byte vLLM's
    # fnuz clamp can write (all but 0x80, 0x7F, 0xFF), e4m3fn reads exactly
    # twice the value, so each score doubles (a power of two: exact in fp32)
    # and no top-k changes. The prefill scores, judged absolutely, still show
    # it; decode returns only the top-k.
    every = torch.arange(256, dtype=torch.int32).to(torch.uint8)
    written = e4m3(every.view(torch.float8_e4m3fnuz).float(), E4M3FNUZ)
    writable = set(written.view(torch.uint8).tolist()) - {0x80}  # 0x80: NaN in
    assert not writable & {0x7F, 0xFF}
    b = torch.tensor(sorted(writable), dtype=torch.uint8)
    fn, fnuz = (
        b.view(torch.float8_e4m3fn).float(),
        b.view(torch.float8_e4m3fnuz).float(),
    )
    assert torch.equal(fn, 2 * fnuz)


def test_a_record_from_before_the_batch_was_widened_reads_as_one_sequence():
    legacy = {
        "blocks": 24,
        "index_dim": 128,
        "topk": 16,
        "init_blocks": 0,
        "local_blocks": 1,
        "prefill_queries": 4,
        "planted": [2, 9, 17],
        "decode_requests": 3,
        "short_tail": 50,
        "seed": 0,
    }
    case = Case.from_record(legacy)
    assert case.lengths == (24 * 128 - 50,) and case.decode == (0, 0, 0)
    assert case.prefill == ((0, 4),) and not case.marked
    assert Case.from_record(CASE.to_record()) == CASE
