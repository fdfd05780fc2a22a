"""The benchmarks that need a GPU say so plainly where there is none."""

from __future__ import annotations

import pytest

from vllm_minimax_m3_kv_sim.plumbing.children import run_python


def test_the_decode_scorer_benchmark_times_nothing_without_a_gpu():
    import torch  # here, not at collection: the fast tier imports no torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is here: it would time")
    proc = run_python(["-m", "benchmarks.decode_scorer"], {}, 120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip().startswith("no GPU in this process: nothing timed")
