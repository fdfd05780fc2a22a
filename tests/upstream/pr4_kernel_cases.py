"""PR 4's kernel cases, from vLLM's test module as the PR leaves it, on a CPU.

``python -m tests.upstream.pr4_kernel_cases --tests DIR --out F``, started
with :func:`vllm_minimax_m3_kv_sim.kernels.kernel_env` and PR 4's overlay on
``PYTHONPATH``, simulates gfx950, loads
``kernels/attention/test_minimax_m3_fp8_triton_indexer.py`` from ``DIR`` (a
``tests/`` tree :func:`tests.upstream.overlay.vllm_test_tree` made) with its
device set to the CPU, the one edit (its cases write ``dev = "cuda"``), and
calls every parametrization of its fp8 decode and prefill cases: ROCm's Triton
scorers (``amd/ops/index_topk.py``) under Triton's interpreter. That is the
interpreter, not the gfx950 compiler (``tests/kernels/test_rocm_aot_compile.py``
compiles them for gfx950). Writes the scorers' module and each case's outcome.
"""

from __future__ import annotations

import argparse
import json
import sys
import types
from pathlib import Path

MODULE = "kernels/attention/test_minimax_m3_fp8_triton_indexer.py"
CASES = (
    "test_fp8_index_query_and_cache_decode_topk_matches_bf16",
    "test_fp8_index_query_and_cache_prefill_topk_matches_bf16",
)


def run(tests: Path) -> dict[str, object]:
    from vllm_minimax_m3_kv_sim.kernels import prepare_triton

    device = prepare_triton("mi355x")
    source = (tests / MODULE).read_text(encoding="utf-8")
    assert source.count('dev = "cuda"') == 3, "the cases' device line moved"
    module = types.ModuleType("pr4_kernel_cases")
    module.__file__ = str(tests / MODULE)
    code = compile(source.replace('dev = "cuda"', f'dev = "{device}"'), MODULE, "exec")
    exec(code, module.__dict__)  # vLLM's own test module, device edited
    outcomes: dict[str, str] = {}
    for name in CASES:
        case = getattr(module, name)
        (parametrize,) = [m for m in case.pytestmark if m.name == "parametrize"]
        _names, values = parametrize.args
        for value in values:
            args = value.values if hasattr(value, "values") else (value,)
            case_id = getattr(value, "id", None) or "-".join(map(str, args))
            try:
                case(*args)
                outcomes[f"{name}[{case_id}]"] = "passed"
            except Exception as error:  # each case's own failure, reported
                outcomes[f"{name}[{case_id}]"] = f"{type(error).__name__}: {error}"
    return {"scorers": module.minimax_m3_index_decode.__module__, "cases": outcomes}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tests", required=True, type=Path)
    parser.add_argument("--out", required=True)
    options = parser.parse_args()
    Path(options.out).write_text(json.dumps(run(options.tests)))


if __name__ == "__main__":
    sys.exit(main())
