"""vLLM's ROCm Triton indexer on an fp8 index cache (MI355X, AITER off).

Each child (``tests/kernels/rocm_fp8_scorers.py``) is one process under a
simulated MI355X, the kernels run under Triton's interpreter on CPU: the
scorers vLLM's indexer module imports on ROCm (``amd/ops/index_topk.py``),
never a re-implementation. The only thing changed under them is the
interpreter's bf16 ``tl.dot`` (``vllm_minimax_m3_kv_sim/kernels.py``, triton#11584), which the
bf16 side of each comparison needs; the fp8 side never takes it.
"""

from __future__ import annotations

import tempfile

import pytest

from vllm_minimax_m3_kv_sim.kernels import kernel_env
from vllm_minimax_m3_kv_sim.plumbing.children import json_from_out_file

CHILD = ["-m", "tests.kernels.rocm_fp8_scorers"]
SKIP = {"VLLM_MINIMAX_M3_KV_SKIP_SELFTEST": "1"}


def _child(*args: str, env: dict[str, str] | None = None) -> dict:
    # Each child keeps its node verdicts in a cache root of its own, unless
    # the test shares one (the cached-verdict test).
    env = {"VLLM_CACHE_ROOT": tempfile.mkdtemp(prefix="m3kv-cache-"), **(env or {})}
    return json_from_out_file([*CHILD, *args], {**kernel_env(), **env}, timeout=1800)


@pytest.fixture(scope="module")
def scorers(tmp_path_factory) -> dict:
    # The self-test runs where a worker runs it: inside the gate, asked from
    # a model-build context (bf16 default dtype, meta default device).
    record = tmp_path_factory.mktemp("selftest") / "record.pt"
    cache_root = tmp_path_factory.mktemp("verdicts")
    out = _child("--record", str(record), env={"VLLM_CACHE_ROOT": str(cache_root)})
    out["record_path"] = str(record)
    out["cache_root"] = str(cache_root)
    return out


def test_the_plugin_selects_vllms_triton_indexer_for_fp8_on_gfx950(scorers):
    assert scorers["gate"] == "MiniMaxM3IndexerTritonImpl"


def test_a_worker_starts_with_the_selftest_run_inside_the_model_build(scorers):
    # vLLM builds the model under set_default_torch_dtype(bf16) and a GPU
    # default device; the gate runs the self-test there and the worker
    # starts (before the fix: NotImplementedError, "Cannot copy out of meta
    # tensor", from the self-test's inputs made on the default device).
    assert scorers["gate"] == "MiniMaxM3IndexerTritonImpl"
    state = scorers["selftest"]["state"]
    assert state["ran"] and state["passed"] and state["cached"] is None


def test_the_selftest_leaves_no_autotune_choice_for_serving(scorers):
    # The prefill top-k kernel is autotuned per BLOCK_SIZE_T and dtypes: a
    # choice made on the self-test's 24-block problem would be kept for
    # serving. The gate puts the autotuner's cache back as it found it.
    assert scorers["autotune_before"] == {"_topk_index_kernel": 0}
    assert scorers["autotune_after"] == scorers["autotune_before"]


def test_the_autotune_check_sees_a_choice_left_behind():
    out = _child("--mutant", "keep_autotune", "--only", "gate")
    assert out["gate"] == "MiniMaxM3IndexerTritonImpl"
    assert out["autotune_after"] == {"_topk_index_kernel": 1}


def test_a_passed_verdict_is_kept_for_the_node_and_read_by_the_next_start(scorers):
    out = _child(
        "--only", "gate,selftest", env={"VLLM_CACHE_ROOT": scorers["cache_root"]}
    )
    assert out["gate"] == "MiniMaxM3IndexerTritonImpl"
    state = out["selftest"]["state"]
    assert state["passed"] and state["cached"].startswith(scorers["cache_root"])
    # Nothing ran: the kernels were not launched, so nothing was tuned.
    assert out["autotune_after"] == {"_topk_index_kernel": 0}


def test_the_opt_in_is_never_vouched_for_by_a_verdict_made_without_it(scorers):
    # The balanced fp8 decode scorer serves only with the opt-in: a start
    # with it runs the self-test (launching that scorer) instead of reading
    # the verdict kept by the start without it (before: cached, 0 launches).
    assert scorers["balanced_launches"] == 0
    out = _child(
        "--only",
        "gate,selftest",
        env={
            "VLLM_CACHE_ROOT": scorers["cache_root"],
            "VLLM_MINIMAX_M3_KV_FP8_BALANCED_DECODE": "1",
        },
    )
    state = out["selftest"]["state"]
    assert state["passed"] and state["cached"] is None, state
    assert out["balanced_launches"] > 0


def test_the_selftest_writes_no_autotune_result_for_serving_to_disk():
    # vLLM sets TRITON_CACHE_AUTOTUNING=1: an autotuner with cache_results
    # writes its choice to Triton's disk cache, keyed the same for the toy
    # problem and serving (BLOCK_SIZE_T = 16). The self-test never asks it.
    out = _child("--only", "disk_autotune", env=SKIP)["disk_autotune"]
    assert out["passed"] and out["tuners"] == ["_topk_index_kernel"]
    assert out["disk_cache_asked"] == []
    assert out["cache_results_after"] == [True]  # serving's setting put back


def test_the_disk_autotune_check_sees_a_run_that_would_write():
    out = _child("--mutant", "keep_autotune", "--only", "disk_autotune", env=SKIP)
    assert out["disk_autotune"]["disk_cache_asked"] == ["_topk_index_kernel"]


def test_a_scorer_reading_one_table_for_every_request_stops_the_start():
    # One block table and one length for all requests passed this mutant.
    out = _child("--mutant", "shared_table", "--only", "gate")
    assert out["gate"].startswith("refused: SelftestFailed"), out["gate"]
    assert "fp64 selects" in out["gate"]


def test_a_nan_score_stops_the_start():
    # NaN compares false with any bound: the old judge passed it.
    out = _child("--mutant", "nan_score", "--only", "gate")
    assert out["gate"].startswith("refused: SelftestFailed"), out["gate"]
    assert "not finite where fp64 is finite" in out["gate"]


def test_a_decode_defect_shared_by_every_dtype_stops_the_start():
    # Dropping the last partial block in decode, for fp8 and bf16 alike: a
    # judge comparing fp8 with bf16 on the same kernel passed it.
    out = _child("--mutant", "decode_drops_partial_block", "--only", "gate")
    assert out["gate"].startswith("refused: SelftestFailed"), out["gate"]
    # Decode request 1 reads a sequence whose last block is partial.
    assert "decode_topk_q1 row 1: picked" in out["gate"]
    assert "fp64 selects" in out["gate"]


def test_an_error_inside_the_selftest_is_the_plugins_refusal_with_its_fixes():
    out = _child("--mutant", "inputs_raise", "--only", "gate")
    assert out["gate"].startswith("refused: SelftestFailed"), out["gate"]
    assert "the self-test raised RuntimeError: input creation failed" in out["gate"]
    assert "Fix with one of:" in out["gate"]
    assert "VLLM_MINIMAX_M3_KV_SKIP_SELFTEST=1" in out["gate"]


def test_stock_vllm_refuses_the_same_request():
    out = _child("--mutant", "gate_closed", "--only", "gate", env=SKIP)
    assert out["gate"].startswith("refused: NotImplementedError"), out
    assert "requires CUDA fp8 support" in out["gate"]


def test_fp8_bytes_score_bit_for_bit_as_the_same_values_in_bf16(scorers):
    assert scorers["error"] is None, scorers["error"]
    bitwise = scorers["bitwise"]
    # Prefill score and top-k, decode at query length 1 (GEMV) and 2 (the
    # spec-decode dot), under gfx950's launch policy and the other one; and
    # the tuned "balanced" decode scorer, which vLLM gives bf16 only, on fp8.
    assert len(bitwise) == 10 and all(bitwise.values()), bitwise


def test_vllms_cuda_acceptance_for_fp8_triton_holds_on_the_rocm_scorers(scorers):
    assert scorers["cuda_acceptance"] == {
        "planted_kept": True,
        "overlap_at_least_14": True,
    }


def test_vllms_decode_launch_policy_is_left_alone_by_default(scorers):
    # The tuned "balanced" kernel for bf16, split-K (None) for fp8: vLLM's own.
    policy = scorers["policy"]
    assert policy["bf16"] is not None and policy["fp8"] is None, policy
    assert not policy["entry_applied"]


def test_the_opt_in_offers_fp8_the_balanced_decode_scorer():
    out = _child(
        "--only",
        "policy",
        env={**SKIP, "VLLM_MINIMAX_M3_KV_FP8_BALANCED_DECODE": "1"},
    )
    policy = out["policy"]
    assert policy["entry_applied"]
    assert policy["fp8"] == policy["bf16"] is not None
    # Only an fp8 query beside an fp8 cache, as the model allocates them.
    assert policy["fp8_query_bf16_cache"] is None


def test_stale_bytes_in_unwritten_slots_never_reach_a_score_or_top_k(scorers):
    # The spare page and the last block's tail hold NaN, 448 or -0 in every
    # byte, as a reused block that nobody zeroed would.
    assert scorers["stale"] == {"0xff": True, "0x7e": True, "0x80": True, "0x7f": True}


def test_the_stale_byte_comparison_sees_a_slot_that_is_read():
    out = _child("--mutant", "stale_read", "--only", "stale", env=SKIP)
    assert set(out["stale"]) == {"0x7e", "0xfe"}
    assert False in out["stale"].values(), out["stale"]


def test_an_index_query_left_bf16_cannot_run_beside_an_fp8_cache():
    # Why the model's index query must stay in the cache dtype (it does:
    # amd/model.py allocates it as index_cache.dtype).
    out = _child("--mutant", "bf16_query", "--only", "bitwise", env=SKIP)
    assert not any(out["bitwise"].values())
    assert "fp8e4nv" in out["error"]


def test_the_node_selftest_passes_on_these_kernels(scorers):
    selftest = scorers["selftest"]
    assert selftest["passed"], selftest["failures"]
    assert selftest["checked"] > 100
    assert selftest["line"].startswith("selftest passed on CPU (Triton interpreter)")
    assert "writer: not run" in selftest["line"]


def test_a_failing_selftest_stops_the_indexer_from_being_selected():
    out = _child("--mutant", "corrupt_reference", "--only", "gate")
    assert out["gate"].startswith("refused: SelftestFailed"), out["gate"]
    assert "prefill scores:" in out["gate"]
    assert "VLLM_MINIMAX_M3_KV_SKIP_SELFTEST=1" in out["gate"]


def test_the_selftest_record_replays_bit_for_bit(scorers, tmp_path):
    out = _child("--replay", scorers["record_path"], env=SKIP)
    assert out["replay_differs"] == []
    # And a replay can fail: one recorded top-k entry changed.
    import torch

    from vllm_minimax_m3_kv.entrypoints.selftest import load_record, save_record

    record = load_record(scorers["record_path"])
    record["outputs"]["decode_topk_q1"][0, 0, 0] += 1
    tampered = tmp_path / "tampered.pt"
    save_record(record, tampered)
    assert torch.equal(load_record(tampered)["outputs"]["decode_topk_q1"],
                       record["outputs"]["decode_topk_q1"])  # fmt: skip
    out = _child("--replay", str(tampered), env=SKIP)
    assert out["replay_differs"] == ["decode_topk_q1"]


# -- MI300X / MI325X (gfx942): the same scorers on an e4m3fnuz index cache ------

FNUZ = ["--hardware", "mi300x"]


@pytest.fixture(scope="module")
def fnuz_scorers(tmp_path_factory) -> dict:
    record = tmp_path_factory.mktemp("selftest_fnuz") / "record.pt"
    out = _child(*FNUZ, "--record", str(record))
    out["record_path"] = str(record)
    return out


def test_an_mi300x_worker_starts_with_the_selftest_inside_the_model_build(
    fnuz_scorers,
):
    assert fnuz_scorers["gate"] == "MiniMaxM3IndexerTritonImpl"
    assert fnuz_scorers["selftest"]["state"]["passed"]
    assert fnuz_scorers["autotune_after"] == fnuz_scorers["autotune_before"]


def test_the_plugin_selects_vllms_triton_indexer_for_fnuz_on_gfx942(fnuz_scorers):
    assert fnuz_scorers["gate"] == "MiniMaxM3IndexerTritonImpl"


def test_stock_vllm_refuses_fp8_on_gfx942_too():
    out = _child(*FNUZ, "--mutant", "gate_closed", "--only", "gate", env=SKIP)
    assert "requires CUDA fp8 support" in out["gate"], out


def test_fnuz_bytes_score_bit_for_bit_as_the_same_values_in_bf16(fnuz_scorers):
    assert fnuz_scorers["error"] is None, fnuz_scorers["error"]
    bitwise = fnuz_scorers["bitwise"]
    assert len(bitwise) == 10 and all(bitwise.values()), bitwise
    assert fnuz_scorers["cuda_acceptance"] == {
        "planted_kept": True,
        "overlap_at_least_14": True,
    }


def test_stale_bytes_never_reach_an_fnuz_score(fnuz_scorers):
    # 0x80 is NaN in fnuz (-0 in e4m3fn); 0x7F/0xFF are +-240.
    assert fnuz_scorers["stale"] == {
        "0xff": True,
        "0x7e": True,
        "0x80": True,
        "0x7f": True,
    }


def test_the_node_selftest_runs_fnuz_on_gfx942(fnuz_scorers):
    selftest = fnuz_scorers["selftest"]
    assert selftest["passed"], selftest["failures"]
    assert "float8_e4m3fnuz index scores" in selftest["line"]
    # The writer's cast bytes are checked on a GPU only.
    assert "writer: not run (Triton's interpreter" in selftest["line"]


def test_the_fnuz_selftest_record_replays_bit_for_bit(fnuz_scorers):
    out = _child(*FNUZ, "--replay", fnuz_scorers["record_path"], env=SKIP)
    assert out["replay_differs"] == []
