"""pytest plugin: the simulated accelerator for a whole test run.

``SIM_HARDWARE=mi355x SIM_AITER=msa python -m pytest -p vllm_minimax_m3_kv_sim.plumbing.pytest_hardware``
makes that platform (and, on ROCm, aiter in that state) the current one before
any test module imports vLLM, so test files written for a GPU machine (vLLM's
own, in ``upstream/``) run here unchanged. Only hardware is stood in for.
"""

from __future__ import annotations

import os

from vllm_minimax_m3_kv_sim.hardware import simulate


def pytest_configure(config: object) -> None:
    if platform := os.environ.get("SIM_HARDWARE"):
        simulate(platform, os.environ.get("SIM_AITER", "msa"))
