"""The device check, without a GPU, and the records it brings back from one.

The check (``vllm_minimax_m3_kv_sim/programs/device_check.py``) runs on the
lent GPU machine, where torch and Triton are and vLLM is not, from the bundle
``vllm_minimax_m3_kv_sim/device_bundle.py`` builds (vLLM's kernel sources,
carried verbatim, under a stand-in ``vllm`` package). Here it runs the same
way, vLLM shadowed by the bundle, with Triton's interpreter and ``meta``
standing for the GPU; its record is then replayed through the real vLLM.
Records from real GPUs live in ``tests/data/device_records/``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from vllm_minimax_m3_kv.entrypoints.selftest import judge_record, load_record
from vllm_minimax_m3_kv_sim import REPO
from vllm_minimax_m3_kv_sim.device_bundle import build
from vllm_minimax_m3_kv_sim.kernels import kernel_env
from vllm_minimax_m3_kv_sim.plumbing.children import json_from_out_file

RECORDS = sorted((REPO / "tests" / "data" / "device_records").glob("*.pt"))


def _replay(record: Path, hardware: str) -> list[str]:
    out = json_from_out_file(
        ["-m", "tests.kernels.rocm_fp8_scorers", "--hardware", hardware,
         "--replay", str(record)],
        {**kernel_env(), "VLLM_MINIMAX_M3_KV_SKIP_SELFTEST": "1"},
        timeout=1200,
    )  # fmt: skip
    return out["replay_differs"]


@pytest.fixture(scope="module")
def device_check(tmp_path_factory) -> dict:
    bundle = tmp_path_factory.mktemp("bundle")
    out = tmp_path_factory.mktemp("device_out")
    build(bundle)
    # Only what the device machine has: no vLLM on the path but the bundle's.
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": os.environ.get("HOME", "/root"),
        "PYTHONPATH": f"{bundle}{os.pathsep}{REPO}",
        "TRITON_INTERPRET": "1",
    }
    proc = subprocess.run(
        [sys.executable, "-m", "vllm_minimax_m3_kv_sim.programs.device_check",
         "--cpu", "--out", str(out)],
        env=env, capture_output=True, text=True, timeout=1200, cwd=REPO,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads((out / "device_check.json").read_text())
    report["record_path"] = str(out / "selftest_record.pt")
    return report


def test_the_device_check_runs_on_the_bundle_alone(device_check):
    assert device_check["vllm_is_stand_in"]
    carried = device_check["bundle"]["carried"]
    assert "models/minimax_m3/common/ops/index_topk.py" in carried


def test_the_selftest_passes_inside_a_model_build_context_then_reads_its_verdict(
    device_check,
):
    first, second = device_check["start_safety"]["asks"]
    assert first["passed"] and first["cached"] is None, first
    assert second["passed"] and second["cached"], second
    # A kept verdict costs a file read, not the kernels.
    assert second["seconds"] < first["seconds"] / 100
    safety = device_check["start_safety"]
    assert safety["autotune_after"] == safety["autotune_before"]


def test_the_device_check_sees_each_kernel_mutant_fail(device_check):
    # On the GPU these run natively; here on the bundle under the interpreter.
    verdicts = device_check["mutants"]
    assert set(verdicts) == {"shared_table", "nan_score"}
    assert not any(v["passed"] for v in verdicts.values()), verdicts


def test_the_device_checks_record_replays_bit_for_bit_through_vllm(device_check):
    # Recorded with the carried sources; replayed with the installed vLLM's
    # CUDA scorers (simulated H200), which must be the same code.
    assert _replay(Path(device_check["record_path"]), "h200") == []


GPU_RECORDS = pytest.mark.parametrize(
    "record",
    RECORDS or [pytest.param(None, marks=pytest.mark.skip(reason="no GPU record yet"))],
    ids=[r.stem for r in RECORDS] or ["none"],
)


@GPU_RECORDS
def test_every_gpu_record_passes_the_selftests_judge(record):
    # An H200's fp8 MMA adds the exact e4m3 products with fewer bits than
    # fp32 (every score off fp64 by up to 0.097, over 1,000 ulps): the judge
    # must pass what a sound matrix unit computes, or no worker starts.
    result = judge_record(load_record(record))
    assert result.passed, result.failures
    assert result.record["score_error"] < 0.5  # room left under the bound


@GPU_RECORDS
def test_the_judge_still_refuses_a_gpu_record_read_in_the_wrong_fp8_flavour(record):
    # e4m3fnuz bytes read as e4m3fn (or back) scale every value by two.
    tampered = load_record(record)
    tampered["outputs"]["prefill_score"] = tampered["outputs"]["prefill_score"] / 2
    result = judge_record(tampered)
    assert not result.passed
    assert result.failures[0].startswith("prefill scores: 96 of 96 off"), (
        result.failures
    )


def provenance_problems(record: Path) -> list[str]:
    """Why ``record`` is not what a GPU made: its device is no GPU, its
    provenance (the device check's JSON beside it) names another device or
    other versions, or its prefill scores show no GPU's rounding (fp32 sums of
    these e4m3 products are exact, so a CPU's scores are fp64 rounded once;
    an fp8 matrix unit's differ from fp64 by more than one fp32 ulp)."""
    import torch

    from vllm_minimax_m3_kv.entrypoints.selftest import _case_and_bytes
    from vllm_minimax_m3_kv.selftest_judge import references

    data = load_record(record)
    problems = []
    device = str(data.get("device"))
    if device.startswith("CPU") or not device.strip():
        problems.append(f"made on {device}")
    beside = record.with_suffix(".json")
    provenance = json.loads(beside.read_text()) if beside.exists() else {}
    if provenance.get("gpu") != device:
        problems.append(f"{beside.name} names {provenance.get('gpu')}, not {device}")
    versions = data.get("versions", {})
    for name in ("torch", "triton"):
        if name in versions and versions[name] != provenance.get(name):
            problems.append(f"{name} {versions[name]} here, {provenance.get(name)}")
    case, stored = _case_and_bytes(data)
    exact = references(case, stored)["prefill_score"]
    score = data["outputs"]["prefill_score"].double()
    finite = torch.isfinite(exact)
    ulp = torch.finfo(torch.float32).eps * exact[finite].abs()
    beyond = ((score[finite] - exact[finite]).abs() > ulp).float().mean()
    if beyond < 0.5:
        problems.append(
            f"only {float(beyond):.0%} of its scores differ from fp64 beyond fp32 "
            "rounding: no GPU's fp8 sums"
        )
    return problems


@GPU_RECORDS
def test_every_gpu_record_proves_where_it_came_from(record):
    assert provenance_problems(record) == []


@GPU_RECORDS
def test_a_cpu_made_copy_of_a_gpu_record_fails_the_provenance_check(record, tmp_path):
    # The same record with the prefill scores a CPU gives (fp64, rounded
    # once): the judge and the replay still pass it; provenance must not.
    import shutil

    from vllm_minimax_m3_kv.entrypoints.selftest import _case_and_bytes, save_record
    from vllm_minimax_m3_kv.selftest_judge import references

    data = load_record(record)
    case, stored = _case_and_bytes(data)
    data["outputs"]["prefill_score"] = references(case, stored)["prefill_score"].float()
    copy = tmp_path / record.name
    save_record(data, copy)
    shutil.copy(record.with_suffix(".json"), copy.with_suffix(".json"))
    assert judge_record(load_record(copy)).passed
    problems = provenance_problems(copy)
    assert problems and "no GPU's fp8 sums" in problems[-1], problems


@GPU_RECORDS
def test_every_gpu_record_selects_on_cpu_as_on_its_gpu(record):
    # The top-k bit for bit; the scores differ (the interpreter's fp32 sums
    # are exact on these bytes, the GPU's are not), each within the bound.
    assert set(_replay(record, "h200")) <= {"prefill_score"}


def test_the_installed_command_replays_a_gpu_record_on_this_cpu(tmp_path):
    # As docs/troubleshooting.md says: `selftest --replay FILE` on a machine
    # without a GPU, nothing set beforehand (before: TypeError inside vLLM's
    # scorer, whose Triton was a placeholder). One JSON schema.
    from vllm_minimax_m3_kv.entrypoints.selftest import EXIT_PASSED, json_answer
    from vllm_minimax_m3_kv_sim.plumbing.children import child_env

    command = Path(sys.executable).with_name("vllm-minimax-m3-kv")
    env = {
        k: v
        for k, v in child_env({"VLLM_CACHE_ROOT": str(tmp_path)}).items()
        if k not in ("TRITON_INTERPRET", "CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES")
    }
    record = REPO / "tests" / "data" / "device_records" / "h200.pt"
    proc = subprocess.run(
        [str(command), "selftest", "--replay", str(record), "--json"],
        env=env, capture_output=True, text=True, timeout=900, cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == EXIT_PASSED, proc.stderr[-3000:]
    answer = json.loads(proc.stdout)
    assert set(answer) == set(json_answer(0, ran=True))
    assert answer["passed"] and answer["replay"]["device"] == "cpu"
    assert answer["replay"]["topk_differs"] == []
