"""Child for ``test_rocm_aot_compile.py``: every Triton kernel the plugin
routes an fp8 index cache to on ROCm, or ships, compiled for the GPU's ISA by
Triton's AMD backend on this CPU machine (``vllm_minimax_m3_kv_sim/aot.py``).

``python -m tests.kernels.rocm_aot --out F --hardware mi355x|mi300x``

Under a simulated MI355X (gfx950, e4m3fn) or MI300X (gfx942, e4m3fnuz) with
AITER off, vLLM's own wrappers are called as the plugin's Triton indexer calls
them, at the shapes serving uses: index heads per rank 1 (TP 4, 8) and 4
(TP 1); prefill; decode at query length 1 and 2 (MTP), for a short and a long
context (vLLM's top-k launch policy differs), with vLLM's launch policy and
with the plugin's opt-in balanced decode scorer; on gfx942 also the plugin's
fnuz index writer. Writes, as JSON, per case: the kernels compiled (pointer
types, the ISA of the code object, its size, its MFMA instructions), or the
compiler's error. ``bf16_query`` cases hold a bf16 index query against the
fp8 cache, which must not compile where vLLM takes ``tl.dot``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
from pathlib import Path
from typing import Any

ARCH = {"mi355x": "gfx950", "mi300x": "gfx942"}
HEADS = (1, 4)
QUERY_SHAPES = {"q1": (1, 1), "q1mtp": (1, 2), "q2mtp": (2, 2)}
"""Decode query length and the configured maximum: no MTP (1 of 1); MTP with
one draft token, a plain step (1 of 2) and a verification step (2 of 2)."""
CONTEXTS = {"3k": 3000, "64k": 65536}
"""Tokens: 24 blocks (vLLM's short decode top-k launch) and 512 (its long one)."""


def _tensors(length: int, heads: int, rows: int, fp8: Any, query: Any) -> dict:
    import torch

    blocks = -(-length // 128)
    return {
        "cache": torch.zeros(blocks + 1, 128, 128, dtype=fp8),
        "table": torch.arange(blocks, dtype=torch.int32).view(1, -1),
        "q": torch.zeros(rows, heads, 128, dtype=query),
    }


def _decode(heads: int, shape: tuple, length: int, fp8: Any, query: Any) -> None:
    import torch
    from vllm.models.minimax_m3.common import indexer

    requests = 3
    query_len, max_query_len = shape
    t = _tensors(length, heads, requests * query_len, fp8, query)
    tables = t["table"].expand(requests, -1).contiguous()
    lens = torch.full((requests,), length, dtype=torch.int32)
    indexer.minimax_m3_index_decode(
        t["q"], t["cache"], tables, lens, length, 16, 0, 1, heads, query_len,
        max_query_len,
    )  # fmt: skip


def _prefill(heads: int, length: int, fp8: Any, query: Any) -> None:
    import torch
    from vllm.models.minimax_m3.common import indexer

    n = 4
    t = _tensors(length, heads, n, fp8, query)
    i32 = {"dtype": torch.int32}
    cu = torch.tensor([0, n], **i32)
    lens, prefix = torch.tensor([length], **i32), torch.tensor([length - n], **i32)
    score = indexer.minimax_m3_index_score(
        t["q"], t["cache"], t["table"], cu, lens, prefix, n, length, heads
    )
    indexer.minimax_m3_index_topk(score, cu, prefix, n, 16, 0, 1)


def _writer(fp8: Any) -> None:
    import torch

    from vllm_minimax_m3_kv.model_executor.models.minimax_m3_rocm_fnuz_index_writer import (
        clamp_cast_index,
        fnuz_max,
    )

    tokens = 64
    qkv = torch.zeros(tokens, 1024, dtype=torch.bfloat16)
    clamp_cast_index(
        qkv[:, 896:],  # the index key: qkv's last 128 columns, row-strided
        torch.zeros(tokens, 128, dtype=torch.bfloat16),
        torch.zeros(4, 128, 128, dtype=fp8),
        torch.zeros(tokens, 128, dtype=fp8),
        torch.arange(tokens),
        fnuz_max(),
    )


def _compile(arch: str, launch: Any) -> dict[str, Any]:
    from vllm_minimax_m3_kv_sim.aot import compiling_for

    with compiling_for(arch) as compiled:
        try:
            launch()
        except Exception as error:
            cause = error
            while cause.__cause__ is not None:
                cause = cause.__cause__
            return {"error": f"{type(error).__name__}: {cause}"[:400]}
    return {"kernels": [dataclasses.asdict(kernel) for kernel in compiled]}


def cases(arch: str) -> dict[str, Any]:
    import torch

    from vllm_minimax_m3_kv.selftest import platform_fp8

    fp8 = platform_fp8().torch_dtype
    bf16 = torch.bfloat16
    out: dict[str, Any] = {}
    for heads in HEADS:
        out[f"prefill:h{heads}"] = _compile(
            arch, lambda h=heads: _prefill(h, CONTEXTS["3k"], fp8, fp8)
        )
        for shape_name, shape in QUERY_SHAPES.items():
            for name, length in CONTEXTS.items():
                out[f"decode:h{heads}:{shape_name}:{name}"] = _compile(
                    arch,
                    lambda h=heads, q=shape, n=length: _decode(h, q, n, fp8, fp8),
                )
            out[f"bf16_query:h{heads}:{shape_name}"] = _compile(
                arch,
                lambda h=heads, q=shape: _decode(h, q, CONTEXTS["3k"], fp8, bf16),
            )
    if arch == "gfx942":
        out["writer"] = _compile(arch, lambda: _writer(fp8))
    return out


def balanced_cases(arch: str) -> dict[str, Any]:
    """vLLM's tuned balanced decode scorer on fp8, as the plugin's opt-in
    (``VLLM_MINIMAX_M3_KV_FP8_BALANCED_DECODE=1``) routes it: the registry
    entry applied now, as a worker applies it when it imports the module."""
    import sys

    from vllm.models.minimax_m3.common import indexer

    from vllm_minimax_m3_kv.patch_sites import _patch_decode_budget
    from vllm_minimax_m3_kv.selftest import platform_fp8

    os.environ["VLLM_MINIMAX_M3_KV_FP8_BALANCED_DECODE"] = "1"
    _patch_decode_budget(sys.modules[indexer.minimax_m3_index_decode.__module__])
    fp8 = platform_fp8().torch_dtype
    return {
        f"balanced:h{heads}:{shape_name}": _compile(
            arch, lambda h=heads, q=shape: _decode(h, q, 3000, fp8, fp8)
        )
        for heads in HEADS
        for shape_name, shape in QUERY_SHAPES.items()
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--hardware", default="mi355x")
    args = parser.parse_args()
    os.environ.pop("VLLM_MINIMAX_M3_KV_FP8_BALANCED_DECODE", None)
    # Triton compiles for real here: no interpreter. vLLM keeps Triton where
    # CUDA_VISIBLE_DEVICES is set, empty included (kernels.kernel_env).
    for name in ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES"):
        os.environ.setdefault(name, "")
    if os.environ.get("TRITON_INTERPRET") == "1":
        raise RuntimeError("start this child without TRITON_INTERPRET")
    from vllm_minimax_m3_kv_sim.hardware import simulate

    simulate(args.hardware)
    os.environ.setdefault("VLLM_PLUGINS", "minimax_m3_kv")
    from vllm.plugins import load_general_plugins

    load_general_plugins()
    arch = ARCH[args.hardware]
    out = {"arch": arch, "cases": {**cases(arch), **balanced_cases(arch)}}
    args.out.write_text(json.dumps(out))


if __name__ == "__main__":
    main()
