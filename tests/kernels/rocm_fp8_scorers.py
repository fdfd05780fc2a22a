"""Child for ``test_rocm_fp8_triton_indexer.py``: vLLM's ROCm indexer scorers
on an fp8 index cache, under a simulated MI355X (e4m3fn) or MI300X (e4m3fnuz).

``python -m tests.kernels.rocm_fp8_scorers --out F [--hardware mi300x]
[--mutant NAME] [--record R | --replay R]``

Without a GPU, vLLM sees ROCm gfx950 (or gfx942) with AITER off, so its indexer module
imports ``models/minimax_m3/amd/ops/index_topk.py`` and the kernels run under
Triton's interpreter. Writes, as JSON:

* ``gate``: what the plugin's (or, with ``--mutant gate_closed``, stock
  vLLM's) ``select_indexer_impl_cls`` gives an fp8 index cache;
* ``bitwise``: per output, whether the scorers give the same result on e4m3
  bytes as on the same values in bf16 (both launch policies: gfx950's and
  the other one);
* ``selftest``: the node self-test's verdict, with its failures;
* ``cuda_acceptance``: vLLM's own acceptance for CUDA's fp8 Triton indexer
  (``tests/kernels/attention/test_minimax_m3_fp8_triton_indexer.py``:
  planted blocks never lost, at least 14 of 16 blocks shared with bf16),
  on the ROCm scorers and this run's fp8-vs-bf16 top-k.

Mutants (each must make the test fail): ``gate_closed`` (the plugin's gate
entry off), ``bf16_query`` (the index query left bf16 beside the fp8 cache),
``corrupt_reference`` (the self-test's fp64 reference computed on bytes one
step off, the kernels under test left alone: the gate must refuse),
``decode_drops_partial_block`` (vLLM's decode scorer handed lengths less
their last partial block, in every dtype: the gate must refuse),
``inputs_raise`` (input creation raises: the gate refuses with the plugin's
fixes), ``keep_autotune`` (the self-test leaves its autotuner choices, in
memory and on disk: the state checks must see them), ``shared_table`` (every
request reads request 0's block table and length: the gate must refuse),
``nan_score`` (the prefill scorer returns NaN for block 0: the gate must
refuse).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from vllm_minimax_m3_kv_sim.kernels import prepare_triton
from vllm_minimax_m3_kv_sim.mutants import KERNEL_MUTANTS

HARDWARE = "mi355x"


def _fmt() -> Any:
    from vllm_minimax_m3_kv.selftest import platform_fp8

    return platform_fp8()


def _gate(mutant: str | None) -> str:
    """The class vLLM's indexer gets for an fp8 index cache, or its refusal,
    asked where vLLM's model build asks it: under the loader's bf16 default
    dtype and a non-CPU default device (``meta`` standing for the GPU). The
    node self-test runs first (under the interpreter here), except where the
    run checks the gate alone (``VLLM_MINIMAX_M3_KV_SKIP_SELFTEST=1``)."""
    import torch
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.models.minimax_m3.common import indexer
    from vllm.utils.torch_utils import set_default_torch_dtype

    select = indexer.select_indexer_impl_cls
    if mutant == "gate_closed":
        select = getattr(select, "__wrapped__", select)
    if mutant == "corrupt_reference":
        _corrupt_reference()
    if mutant == "decode_drops_partial_block":
        _decode_drops_partial_block()
    if mutant == "inputs_raise":
        _inputs_raise()
    if mutant == "keep_autotune":
        from vllm_minimax_m3_kv import selftest

        selftest._autotuners = lambda module: []
    if mutant in KERNEL_MUTANTS:
        KERNEL_MUTANTS[mutant]()
    with (
        set_current_vllm_config(VllmConfig()),
        set_default_torch_dtype(torch.bfloat16),
        torch.device("meta"),
    ):
        try:
            return select(topk_blocks=16, indexer_kv_dtype="fp8").__name__
        except Exception as error:
            return f"refused: {type(error).__name__}: {error}"


def _decode_drops_partial_block() -> None:
    """vLLM's decode scorer handed each request's length less its last
    partial block, for fp8 and bf16 alike: a defect a relative judge (fp8 vs
    bf16 on the same kernel) cannot see."""
    from vllm.models.minimax_m3.common import indexer

    decode = indexer.minimax_m3_index_decode

    def without_partial_block(q, cache, tables, lens, *args, **kwargs):
        return decode(q, cache, tables, lens - lens % 128, *args, **kwargs)

    indexer.minimax_m3_index_decode = without_partial_block


def _balanced_launches() -> list[int]:
    """Counts launches of vLLM's tuned "balanced" decode scorer (what the
    opt-in gives fp8) from now on."""
    from vllm_minimax_m3_kv.selftest import scorer_module

    kernel = scorer_module()._decode_index_score_balanced_kernel
    count = [0]
    run = kernel.run

    def counted(*args: Any, **kwargs: Any) -> Any:
        count[0] += 1
        return run(*args, **kwargs)

    kernel.run = counted
    return count


def _disk_autotune(mutant: str | None) -> dict[str, Any]:
    """Whether the self-test asks Triton's disk cache for autotune results
    (where a run writes them). vLLM sets TRITON_CACHE_AUTOTUNING=1, so on a
    GPU the scorers' autotuners cache to disk; the interpreter never does, so
    here they are set as a GPU has them, with every config kept and timed by
    a stand-in (no driver), and the disk-cache call is recorded instead of
    made."""
    from triton.runtime import autotuner

    from vllm_minimax_m3_kv import selftest, selftest_gate

    pinned = autotuner.Autotuner.prune_configs
    autotuner.Autotuner.prune_configs = pinned.__wrapped__
    autotuner.Autotuner._bench = lambda self, *a, config, **k: (
        [float(self.configs.index(config) + 1)] * 3
    )
    asked: list[str] = []

    def check_disk_cache(self: Any, key: Any, configs: Any, bench: Any) -> bool:
        asked.append(self.base_fn.__name__)
        bench()
        return False

    autotuner.Autotuner.check_disk_cache = check_disk_cache
    tuners = selftest._autotuners(selftest.scorer_module())
    for tuner in tuners:
        tuner.cache_results = True
    if mutant == "keep_autotune":
        selftest._autotuners = lambda module: []
    result = selftest_gate.run_node_selftest()
    return {
        "passed": result.passed,
        "tuners": sorted(t.base_fn.__name__ for t in tuners),
        "disk_cache_asked": asked,
        "cache_results_after": [t.cache_results for t in tuners],
    }


def _inputs_raise() -> None:
    from vllm_minimax_m3_kv import selftest_gate

    def make_inputs(case: Any) -> Any:
        raise RuntimeError("input creation failed")

    selftest_gate.make_inputs = make_inputs


def _autotune_state() -> dict[str, int]:
    """Entries in the autotuner caches of the scorers serving will launch,
    read here without the plugin's own helper (a mutant replaces it)."""
    from triton.runtime.autotuner import Autotuner
    from triton.runtime.jit import KernelInterface

    from vllm_minimax_m3_kv.selftest import scorer_module

    state = {}
    for value in vars(scorer_module()).values():
        while isinstance(value, KernelInterface):
            if isinstance(value, Autotuner):
                state[value.base_fn.__name__] = len(value.cache)
            value = getattr(value, "fn", None)
    return state


def _corrupt_reference() -> None:
    """The self-test's fp64 reference computed on key bytes one step off;
    the kernels under test are left alone."""
    import torch

    from vllm_minimax_m3_kv import selftest_judge

    reference = selftest_judge.reference_scores

    fp8 = _fmt().torch_dtype

    def one_step_off(case: Any, keys: Any, prefill_q: Any) -> Any:
        nudged = (keys.to(fp8).view(torch.uint8) ^ 1).view(fp8)
        return reference(case, nudged.float(), prefill_q)

    selftest_judge.reference_scores = one_step_off


def _bitwise(mutant: str | None) -> dict[str, bool]:
    """fp8 bytes vs the same values in bf16, for every output, under gfx950's
    launch policy and the other one."""
    import torch
    import vllm.platforms.rocm as rocm
    from vllm.models.minimax_m3.common import indexer as vllm_indexer

    from vllm_minimax_m3_kv import selftest

    case = selftest.Case()
    inputs = selftest.make_inputs(case)
    stored = {name: selftest.e4m3(value, _fmt()) for name, value in inputs.items()}
    if mutant == "bf16_query":
        for name in ("prefill_q", "decode_q"):
            stored[name] = stored[name].to(torch.bfloat16)
    as_bf16 = [value.to(torch.bfloat16) for value in stored.values()]
    results: dict[str, bool] = {}
    on_gfx950 = rocm.on_gfx950
    for policy, gfx950 in (("gfx950", True), ("other", False)):
        rocm.on_gfx950 = lambda gfx950=gfx950: gfx950
        try:
            fp8 = selftest.run_scorers(case, *stored.values(), device="cpu")
            bf16 = selftest.run_scorers(case, *as_bf16, device="cpu")
        except Exception as error:  # Triton refuses bf16 x fp8 dots
            results[f"{policy}:error"] = False
            results["error"] = f"{type(error).__name__}: {error}"[:300]  # type: ignore[assignment]
            continue
        finally:
            rocm.on_gfx950 = on_gfx950
        for name in fp8:
            results[f"{policy}:{name}"] = torch.equal(fp8[name], bf16[name])
        results["_acceptance"] = _cuda_acceptance(case, fp8, bf16)  # type: ignore[assignment]
        if gfx950 and mutant != "bf16_query":
            # vLLM's tuned "balanced" decode scorer, which its policy gives to
            # bf16 only, offered to fp8 as benchmarks/decode_scorer.py times it.
            from vllm_minimax_m3_kv.entrypoints.bench import _balanced_for_fp8

            ops = sys.modules[vllm_indexer.minimax_m3_index_decode.__module__]
            rocm.on_gfx950 = lambda: True
            try:
                with _balanced_for_fp8(ops):
                    balanced = selftest.run_scorers(
                        case, *stored.values(), device="cpu"
                    )
            finally:
                rocm.on_gfx950 = on_gfx950
            for name in ("decode_topk_q1", "decode_topk_q2"):
                results[f"balanced-fp8:{name}"] = torch.equal(
                    balanced[name], bf16[name]
                )
    return results


STALE_BYTES = (0xFF, 0x7E, 0x80, 0x7F)
"""What reused slots may hold: e4m3fn NaN (0xFF, 0x7F), its largest value
(0x7E, 448) and -0 (0x80), in every byte of the slots no token fills."""


def _stale(mutant: str | None) -> dict[str, bool]:
    """Per stale byte: every output equal to the zero-filled pool's, on e4m3
    bytes (and, for the same kernels, on bf16 values)."""
    import torch

    from vllm_minimax_m3_kv import selftest

    case = selftest.Case()
    inputs = selftest.make_inputs(case)
    stored = [selftest.e4m3(value, _fmt()) for value in inputs.values()]
    clean = selftest.run_scorers(case, *stored, device="cpu")
    if mutant == "stale_read":
        # The sequence's last token left unwritten: its slot, which the
        # scorers do read, keeps the stale byte. The comparison must see it.
        paged = selftest._paged

        def one_slot_short(case: Any, keys: Any, device: str, stale: Any = None):
            cache, table = paged(case, keys, device, stale)
            if stale is not None:
                blocks = case.blocks_of(0)
                last = int(table[0, blocks - 1])
                filled = case.lengths[0] - (blocks - 1) * selftest.SPARSE_BLOCK
                cache.view(torch.uint8)[last, filled - 1] = stale
            return cache, table

        selftest._paged = one_slot_short
    same: dict[str, bool] = {}
    # +-448 in every channel: one of the two raises the last query's max.
    for byte in STALE_BYTES if mutant != "stale_read" else (0x7E, 0xFE):
        dirty = selftest.run_scorers(case, *stored, device="cpu", stale=byte)
        same[f"{byte:#04x}"] = all(
            torch.equal(clean[name], dirty[name]) for name in clean
        )
    return same


def _policy() -> dict[str, Any]:
    """vLLM's ROCm decode launch policy for 3 requests on gfx950, as the
    plugin leaves it (or, with VLLM_MINIMAX_M3_KV_FP8_BALANCED_DECODE=1 in
    this process, as its registry entry changes it)."""
    import torch
    from vllm.models.minimax_m3.common import indexer as vllm_indexer

    ops = sys.modules[vllm_indexer.minimax_m3_index_decode.__module__]
    budget = ops._decode_score_program_budget
    fp8, bf16 = _fmt().torch_dtype, torch.bfloat16
    return {
        "bf16": budget(3, 128, bf16, bf16, is_gfx950=True),
        "fp8": budget(3, 128, fp8, fp8, is_gfx950=True),
        "fp8_query_bf16_cache": budget(3, 128, fp8, bf16, is_gfx950=True),
        "entry_applied": hasattr(budget, "__wrapped__"),
    }


def _cuda_acceptance(case: Any, fp8: dict, bf16: dict) -> dict[str, bool]:
    from vllm_minimax_m3_kv.selftest_judge import selected as _selected

    planted_kept, overlap_ok = True, True
    for name in ("prefill_topk", "decode_topk_q1", "decode_topk_q2"):
        rows_fp8 = fp8[name].reshape(-1, case.topk)
        rows_bf16 = bf16[name].reshape(-1, case.topk)
        sequences = [sequence for sequence, _ in case.rows(name)]
        for a, b, s in zip(rows_fp8, rows_bf16, sequences, strict=True):
            planted_kept &= set(case.planted_in(s)) <= _selected(a)
            overlap_ok &= len(_selected(a) & _selected(b)) >= 14
    return {"planted_kept": planted_kept, "overlap_at_least_14": overlap_ok}


def _selftest(record: Path | None) -> dict[str, Any]:
    """The verdict the gate reached in this process (``gate`` ran it inside
    the model-build context), or a run of its own where the gate skipped it."""
    from vllm_minimax_m3_kv import selftest, selftest_gate
    from vllm_minimax_m3_kv.entrypoints.selftest import save_record

    result = (
        selftest_gate._node_result[0]
        if selftest_gate._node_result
        else selftest_gate.run_node_selftest()
    )
    if record is not None:
        save_record(result.record, record)
    return {
        "passed": result.passed,
        "checked": result.checked,
        "failures": result.failures[:5],
        "line": selftest.verdict_line(result),
        "state": selftest_gate.selftest_state(),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--hardware", default=HARDWARE)
    parser.add_argument("--mutant", default=None)
    parser.add_argument("--record", type=Path, default=None)
    parser.add_argument("--replay", type=Path, default=None)
    parser.add_argument("--only", default="gate,policy,bitwise,stale,selftest")
    args = parser.parse_args()
    prepare_triton(args.hardware)
    os.environ.setdefault("VLLM_PLUGINS", "minimax_m3_kv")
    from vllm.plugins import load_general_plugins

    load_general_plugins()
    out: dict[str, Any] = {}
    if args.replay is not None:
        from vllm_minimax_m3_kv.entrypoints.selftest import load_record, replay

        out["replay_differs"] = replay(load_record(args.replay), device="cpu")
    else:
        parts = args.only.split(",")
        if "gate" in parts:
            out["autotune_before"] = _autotune_state()
            balanced = _balanced_launches()
            out["gate"] = _gate(args.mutant)
            out["autotune_after"] = _autotune_state()
            out["balanced_launches"] = balanced[0]
        if "disk_autotune" in parts:
            out["disk_autotune"] = _disk_autotune(args.mutant)
        if "bitwise" in parts:
            bitwise = _bitwise(args.mutant)
            out["cuda_acceptance"] = bitwise.pop("_acceptance", None)
            out["error"] = bitwise.pop("error", None)
            out["bitwise"] = bitwise
        if "policy" in parts:
            out["policy"] = _policy()
        if "stale" in parts:
            out["stale"] = _stale(args.mutant)
        if "selftest" in parts:
            out["selftest"] = _selftest(args.record)
    args.out.write_text(json.dumps(out))


if __name__ == "__main__":
    main()
