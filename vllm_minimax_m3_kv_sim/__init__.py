"""MiniMax-M3 on a simulated accelerator: this project's test and benchmark
harness, not part of the installed plugin.

Real vLLM 0.33 config, model construction (meta device) and KV planning on a
CPU machine; the stand-ins in :mod:`vllm_minimax_m3_kv_sim.hardware` only make
hardware, or the aiter package, look present or absent. Three layers:

- the library, imported by tests and benchmarks: ``hardware`` (the
  simulated GPUs), ``engine`` (vLLM's config, model build and planner),
  ``kernels`` (vLLM's kernels under Triton's interpreter), ``environments``;
- ``plumbing``: child processes (``children``), the fork server that starts
  them, and the pytest plugin that simulates a GPU for a whole run;
- ``programs``: what those child processes run (``python -m ...``).

The repository root is on the import path by ``pythonpath`` in pyproject
(pytest) and by ``plumbing.children`` (every child it starts).
"""

from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
"""The repository checkout: test data, the bundled config, the sources."""
