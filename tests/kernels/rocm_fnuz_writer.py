"""Child for ``test_rocm_fnuz_index_writer.py``: the plugin's fnuz index writer
under a simulated MI300X (gfx942), its Triton kernel under the interpreter.

``python -m tests.kernels.rocm_fnuz_writer --out F [--mutant no_clamp]``

Writes, as JSON:

* ``kernel``: the writer kernel on the self-test's writer inputs: which cache
  slots changed, whether the outliers were stored as +-224, and whether every
  other stored value is the clamped input to within fnuz rounding. Values, not
  bytes: the interpreter's fp8 casts are not bit-exact (no carry into the
  exponent, round-half-up, and a value rounding to zero becomes 0x80, NaN in
  fnuz), so inputs under fnuz's smallest step are left out and the bytes are
  checked by the self-test on a GPU;
* ``routing``: what the wrapped fused insert of vLLM's ROCm MiniMax-M3 model
  does with an fnuz index cache and with a bf16 one. vLLM's fused op is a GPU
  op with no CPU build; a recording stand-in takes its place for this part
  only, and writes a known index query where the op would write the normed one.

Mutant ``no_clamp``: the writer's clamp bound set to infinity (the clamp does
nothing), which the outlier check must see.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

from vllm_minimax_m3_kv_sim.kernels import prepare_triton

FNUZ_STEP = 2.0**-10
"""fnuz e4m3's smallest subnormal step."""


def _kernel(mutant: str | None) -> dict[str, Any]:
    import torch

    from vllm_minimax_m3_kv import selftest, selftest_writer
    from vllm_minimax_m3_kv.model_executor.models.minimax_m3_rocm_fnuz_index_writer import (
        fnuz_max,
    )

    fmt = selftest.platform_fp8()
    if mutant == "no_clamp":
        fmt = selftest.Fp8Format(fmt.dtype, math.inf)
    inputs = selftest_writer.writer_inputs(fmt)
    written = selftest_writer.run_writer(inputs, fmt, "cpu")
    slots = inputs["slots"]
    kept = slots >= 0
    raw = written["cache"].view(torch.uint8).view(-1, 128)
    changed = (raw != selftest_writer.STALE_MARK).any(-1).nonzero().flatten().tolist()

    def stored_right(got: Any, values: Any) -> tuple[bool, bool]:
        values, got = values.float(), got.float()
        # NaN inputs are judged on their own (``nan_stays_nan``).
        got, values = got[~values.isnan()], values[~values.isnan()]
        clamped = values.clamp(-224.0, 224.0)
        outliers = values.abs() >= 224.0
        outliers_ok = bool((got.float()[outliers] == clamped[outliers]).all())
        visible = values.abs() >= FNUZ_STEP
        got = got.float()
        step = clamped.abs() * 2.0**-3 + FNUZ_STEP
        close = (got - clamped).abs() <= step
        # The interpreter's rounding drops the carry into the exponent: a value
        # just under a power of two comes back as half of it.
        dropped_carry = (
            (got.sign() == clamped.sign())
            & ((2 * got - clamped).abs() <= step)
            & (torch.log2(got.abs().clamp_min(FNUZ_STEP)).frac() == 0)
        )
        close |= dropped_carry
        return outliers_ok, bool(close[visible & ~outliers].all())

    keys = written["cache"].view(-1, 128)[slots[kept]]
    nan_keys = inputs["keys"][kept].float().isnan()
    nan_queries = inputs["queries"].float().isnan()
    keys_outliers, keys_close = stored_right(keys, inputs["keys"][kept])
    queries_outliers, queries_close = stored_right(
        written["queries"], inputs["queries"]
    )
    return {
        "fnuz_max": fnuz_max(),
        "dtype": str(written["cache"].dtype),
        "changed_slots": sorted(changed),
        "mapped_slots": sorted(slots[kept].tolist()),
        "outliers_at_224": keys_outliers and queries_outliers,
        "values_close": keys_close and queries_close,
        "nan_inputs": int(nan_keys.sum() + nan_queries.sum()),
        "nan_stays_nan": bool(
            keys.float()[nan_keys].isnan().all()
            and written["queries"].float()[nan_queries].isnan().all()
        ),
    }


def _routing() -> dict[str, Any]:
    """The model module's wrapped fused insert, called as vLLM's ROCm model
    calls it on the path without AITER, with a recording stand-in op."""
    import sys

    import torch
    from vllm.models.minimax_m3.amd import model as amd_model

    from vllm_minimax_m3_kv.model_executor.models.minimax_m3_rocm_fnuz_index_writer import (
        OpsWithFnuzIndexWriter,
        wrap_fused_insert,
    )

    calls: list[dict[str, Any]] = []
    original = amd_model.ops.fused_minimax_m3_qknorm_rope_kv_insert
    signature = __import__("inspect").signature(original.__wrapped__)

    def recording_op(*args: Any, **kwargs: Any) -> None:
        bound = signature.bind(*args, **kwargs)
        calls.append(
            {
                name: (str(value.dtype) if torch.is_tensor(value) else value)
                for name, value in bound.arguments.items()
                if name not in ("qkv", "cos_sin_cache", "positions")
            }
        )
        if bound.arguments.get("index_q_out") is not None:
            bound.arguments["index_q_out"].fill_(3.0)  # "normed" index query

    recording_op.__signature__ = signature  # type: ignore[attr-defined]
    wrapped = wrap_fused_insert(recording_op)
    heads, kv_heads, index_heads, dim = 2, 1, 2, 128
    tokens = 4
    width = (heads + 2 * kv_heads + index_heads + 1) * dim
    qkv = torch.zeros(tokens, width, dtype=torch.bfloat16)
    # Values fnuz holds exactly (4 significant bits, small exponents), so any
    # rounding stores them as they are; token t scaled by 2**t.
    d = torch.arange(dim)
    row = (1 + (d % 8) / 8) * 2.0 ** ((d // 8) % 8 - 4)
    index_k = torch.stack([row * 2.0**t * (-1) ** t for t in range(tokens)])
    qkv[:, -dim:] = index_k.to(torch.bfloat16)
    weight = torch.ones(dim, dtype=torch.bfloat16)
    fnuz, cache_len = torch.float8_e4m3fnuz, 2 * 128
    index_cache = torch.zeros(2, 128, dim, dtype=torch.uint8).view(fnuz)
    index_q = torch.empty(tokens, index_heads * dim, dtype=fnuz)
    index_slots = torch.tensor([5, 200, -1, 7])

    def model_call(cache: Any, query: Any) -> None:
        # amd/model.py, the non-AITER sparse branch, argument for argument.
        wrapped(
            qkv, weight, weight, torch.zeros(8, 64), torch.arange(tokens),
            heads, kv_heads, 64, 1e-6, weight, weight, index_heads,
            torch.arange(tokens), index_slots, torch.zeros(1), cache, 128,
            torch.empty(tokens, heads * dim, dtype=torch.bfloat16), query, "fp8",
        )  # fmt: skip

    model_call(index_cache, index_q)
    fnuz_calls = calls[:]
    calls.clear()
    bf16_cache = torch.zeros(2, 128, dim, dtype=torch.bfloat16)
    model_call(bf16_cache, torch.empty(tokens, index_heads * dim, dtype=torch.bfloat16))
    flat = index_cache.view(cache_len, dim).float()
    return {
        "ops_wrapped": isinstance(amd_model.ops, OpsWithFnuzIndexWriter),
        "other_ops_pass_through": amd_model.ops.paged_attention_rocm
        is sys.modules["vllm._custom_ops"].paged_attention_rocm,
        "fnuz_calls": fnuz_calls,
        "bf16_calls": calls,
        "keys_at_slots": all(
            torch.equal(flat[slot], index_k[t])
            for t, slot in enumerate(index_slots.tolist())
            if slot >= 0
        ),
        "other_slots_zero": int((flat.abs().sum(-1) > 0).sum()) == 3,
        "index_q_is_the_ops_query": bool((index_q.float() == 3.0).all()),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--mutant", default=None)
    parser.add_argument("--only", default="kernel,routing")
    args = parser.parse_args()
    prepare_triton("mi300x")
    import os

    os.environ.setdefault("VLLM_PLUGINS", "minimax_m3_kv")
    from vllm.plugins import load_general_plugins

    load_general_plugins()
    out: dict[str, Any] = {}
    if "kernel" in args.only:
        out["kernel"] = _kernel(args.mutant)
    if "routing" in args.only:
        out["routing"] = _routing()
    args.out.write_text(json.dumps(out))


if __name__ == "__main__":
    main()
