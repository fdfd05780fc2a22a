"""vLLM's own MiniMax-M3 indexer and sparse-attention kernels on a KV pool
allocated and bound the way vLLM's GPU worker does it.

On a machine without a CUDA GPU the kernels run under Triton's interpreter on
CPU tensors (:func:`prepare_triton`, before vLLM is imported); with one they
run natively on it. Everything the kernels read comes from vLLM: the
``KVCacheConfig`` its planner makes from the model's specs (with whatever
plugins the process loaded), ``allocate_kv_cache`` (raw bytes, a view per
layer), ``bind_kv_cache`` (each layer's own ``bind_kv_cache``), and the kernel
wrappers in ``models/minimax_m3/common/ops``. Used by ``tests/kernels`` and
``benchmarks/indexer_fidelity.py``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

HARDWARE = "h200"
"""Simulated when there is no GPU: a CUDA fp8 platform whose MiniMax-M3 path
uses the common Triton indexer and sparse-attention kernels."""


def has_cuda_gpu() -> bool:
    import torch

    return torch.cuda.is_available()


def kernel_env() -> dict[str, str]:
    """The environment a process running the kernels starts with: Triton's
    interpreter where there is no CUDA GPU (read when Triton is imported)."""
    if has_cuda_gpu():
        return {}
    # vLLM's triton_utils keeps Triton only where a GPU driver is active, or
    # where CUDA_VISIBLE_DEVICES is set (a distributed setup); empty is enough.
    # HIP_VISIBLE_DEVICES does the same under a simulated ROCm platform.
    return {
        "TRITON_INTERPRET": "1",
        "CUDA_VISIBLE_DEVICES": "",
        "HIP_VISIBLE_DEVICES": "",
    }


def prepare_triton(hardware: str = HARDWARE) -> str:
    """Set up this process to run Triton kernels; returns the device. Call
    before importing vLLM, in a process started with :func:`kernel_env`.
    Without a GPU, vLLM sees ``hardware`` (a ``vllm_minimax_m3_kv_sim.hardware`` platform)."""
    if has_cuda_gpu():
        return "cuda"
    for name, value in kernel_env().items():
        if os.environ.get(name) != value:
            raise RuntimeError(f"start this process with {name}={value!r}")
    pin_first_autotune_config()
    _make_interpreter_dot_read_bf16()
    from vllm_minimax_m3_kv_sim.hardware import simulate

    simulate(hardware)
    return "cpu"


def pin_first_autotune_config() -> None:
    """The autotuner benchmarks its configs through a GPU driver; under the
    interpreter there is none, and which config wins only changes speed (the
    product's own, which ``selftest --replay`` uses on a CPU)."""
    from vllm_minimax_m3_kv.entrypoints.selftest import (
        pin_first_autotune_config as pin,
    )

    pin()


BF16_DOT_ISSUE = "triton-lang/triton#11584"


def _make_interpreter_dot_read_bf16() -> None:
    """Make the interpreter's ``tl.dot`` multiply bf16 values, as a GPU does.

    Triton's interpreter keeps bf16 tensors as their uint16 bit patterns and
    its ``create_dot`` converts only 8-bit floats before ``np.matmul``, so a
    bf16 dot multiplies the bit patterns (``BF16_DOT_ISSUE``; bf16 is not
    supported by the interpreter, its maintainers say). vLLM's MiniMax-M3
    indexer casts its operands to bf16 and the sparse attention computes in
    the model's bf16, so without this every score and output is garbage.
    Operands are widened to float32 (exact for bf16 and fp8) and accumulated
    in float32, which is what the GPU's bf16 MMA does. Applied only where a
    probe shows the bug, and checked after."""
    if _interpreter_bf16_dot_is_exact():
        return
    import numpy as np
    import triton.language as tl
    from triton.runtime import interpreter

    create_dot = interpreter.InterpreterBuilder.create_dot

    def widened(handle: Any) -> Any:
        if handle.dtype == tl.float32:
            return handle
        data = interpreter._convert_float(handle.data, handle.dtype, tl.float32, None)
        return interpreter.TensorHandle(data.view(np.float32), tl.float32)

    def create_dot_reading_bf16(self: Any, a: Any, b: Any, *args: Any) -> Any:
        if tl.bfloat16 in (a.dtype, b.dtype):
            a, b = widened(a), widened(b)
        return create_dot(self, a, b, *args)

    interpreter.InterpreterBuilder.create_dot = create_dot_reading_bf16
    if not _interpreter_bf16_dot_is_exact():
        raise RuntimeError(
            f"Triton's interpreter still misreads bf16 in tl.dot ({BF16_DOT_ISSUE})"
        )


def _interpreter_bf16_dot_is_exact() -> bool:
    import torch
    import triton
    import triton.language as tl

    @triton.jit
    def dot(a_ptr: Any, b_ptr: Any, out_ptr: Any, N: tl.constexpr) -> None:
        rows, cols = tl.arange(0, N)[:, None] * N, tl.arange(0, N)[None, :]
        product = tl.dot(tl.load(a_ptr + rows + cols), tl.load(b_ptr + rows + cols))
        tl.store(out_ptr + rows + cols, product)

    # Small integers: every product and sum is exact in bf16 and float32.
    a = torch.arange(256).remainder(5).sub(2).view(16, 16).to(torch.bfloat16)
    b = a.t().contiguous()
    out = torch.empty(16, 16)
    dot[(1,)](a, b, out, 16)
    return torch.equal(out, a.float() @ b.float())


@dataclass
class BoundPool:
    """A MiniMax-M3 KV pool as a worker holds it after ``bind_kv_cache``."""

    vllm_config: Any
    kv_cache_config: Any
    layers: dict[str, Any]
    """Layer name -> the layer object, with its bound ``kv_cache``."""
    device: str

    @property
    def sparse_layer(self) -> str:
        return sorted(name for name in self.layers if name.endswith("index_cache"))[0]

    @property
    def index_cache(self) -> Any:
        """What the indexer kernels read: ``[num_blocks, 128, index_dim]``."""
        return self.layers[self.sparse_layer].kv_cache

    @property
    def main_layer(self) -> Any:
        return self.layers[self.sparse_layer.removesuffix(".index_cache")]

    @property
    def main_cache(self) -> Any:
        """What the sparse-attention kernels read, viewed as the layer's impl
        views it (``MiniMaxM3SparseTritonImpl.forward``)."""
        impl = self.main_layer.impl
        cache = self.main_layer.kv_cache
        return cache.view(impl.kv_cache_fp8_dtype) if impl.use_fp8_kv else cache

    def sparse_config(self) -> dict[str, Any]:
        return self.vllm_config.model_config.hf_text_config.sparse_attention_config

    def spec_of(self, layer: str) -> tuple[str, str]:
        for group in self.kv_cache_config.kv_cache_groups:
            specs = getattr(group.kv_cache_spec, "kv_cache_specs", None)
            spec = specs.get(layer) if specs else group.kv_cache_spec
            if layer in group.layer_names and spec is not None:
                return str(spec.dtype), spec.kv_quant_mode.name
        raise KeyError(layer)


def bound_pool(
    engine: dict[str, Any], device: str, kv_bytes: int = 64 << 20
) -> BoundPool:
    """Config, the model's layers (meta device), vLLM's planner, then the
    worker's allocation and binding of the KV cache on ``device``."""
    import torch
    from vllm.config import set_current_vllm_config
    from vllm.v1.worker.utils import allocate_kv_cache, bind_kv_cache

    from vllm_minimax_m3_kv_sim import engine as sim

    vllm_config = sim.make_engine_args(engine).create_engine_config()
    built = sim.build_model(vllm_config)
    (kv_cache_config,) = sim.kv_cache_configs(vllm_config, [built.specs], kv_bytes)
    context = vllm_config.compilation_config.static_forward_context
    with set_current_vllm_config(vllm_config):
        caches = allocate_kv_cache(
            kv_cache_config,
            torch.device(device),
            vllm_config.cache_config.get_resolved_kv_cache_layout(),
        )
        bind_kv_cache(caches, context, [])
    return BoundPool(
        vllm_config, kv_cache_config, {name: context[name] for name in caches}, device
    )


def write_bytes(cache: Any, blocks: Any, values: Any) -> None:
    """Store ``values`` in ``blocks`` of ``cache`` byte for byte, as the fused
    KV insert does: whatever dtype the cache is bound as, the bytes land."""
    target = cache.view(_bytes_dtype(cache))
    target[blocks] = values.view(_bytes_dtype(values)).reshape(target[blocks].shape)


def _bytes_dtype(tensor: Any) -> Any:
    import torch

    return {1: torch.uint8, 2: torch.int16, 4: torch.int32}[tensor.element_size()]


@dataclass
class Request:
    """One sequence in the pool: where its blocks are and what is asked."""

    block_table: Any  # [1, num_blocks] int32
    seq_len: int
    prefill_queries: int


def run_indexer_and_attention(
    pool: BoundPool,
    index_cache: Any,
    main_cache: Any,
    request: Request,
    index_q: Any,
    q: Any,
) -> dict[str, Any]:
    """vLLM's prefill and decode indexer kernels, then its sparse attention
    over the blocks they select, for ``request``. Returns their outputs."""
    import torch
    from vllm.models.minimax_m3.common.ops.index_topk import (
        minimax_m3_index_decode,
        minimax_m3_index_score,
        minimax_m3_index_topk,
    )
    from vllm.models.minimax_m3.common.ops.sparse_attn import (
        minimax_m3_sparse_attn,
        minimax_m3_sparse_attn_decode,
    )

    sparse = pool.sparse_config()
    topk, init, local = (
        int(sparse["sparse_topk_blocks"]),
        int(sparse.get("sparse_init_block", 0)),
        int(sparse.get("sparse_local_block", 1)),
    )
    impl = pool.main_layer.impl
    heads = index_q.shape[1]
    device = pool.device
    n, length = request.prefill_queries, request.seq_len
    table = request.block_table.to(device)
    cu_seqlens = torch.tensor([0, n], dtype=torch.int32, device=device)
    seq_lens = torch.tensor([length], dtype=torch.int32, device=device)
    prefix = torch.tensor([length - n], dtype=torch.int32, device=device)
    # Prefill: the last n tokens of the sequence are the queries.
    score = minimax_m3_index_score(
        index_q[:n], index_cache, table, cu_seqlens, seq_lens, prefix, n, length, heads
    )
    prefill_topk = minimax_m3_index_topk(
        score, cu_seqlens, prefix, n, topk, init, local
    )
    prefill_out = torch.empty_like(q[:n])
    minimax_m3_sparse_attn(
        q[:n],
        main_cache,
        prefill_topk,
        table,
        cu_seqlens,
        seq_lens,
        prefix,
        n,
        impl.num_kv_heads,
        impl.scale,
        prefill_out,
    )
    # Decode: one more token.
    decode_topk = minimax_m3_index_decode(
        index_q[n : n + 1], index_cache, table, seq_lens, length, topk, init, local,
        heads, 1, 1,
    )  # fmt: skip
    decode_out = torch.empty_like(q[n : n + 1])
    minimax_m3_sparse_attn_decode(
        q[n : n + 1],
        main_cache,
        decode_topk,
        table,
        seq_lens,
        impl.num_kv_heads,
        impl.scale,
        decode_out,
        1,
    )
    return {
        "prefill_score": score,
        "prefill_topk": prefill_topk,
        "prefill_out": prefill_out,
        "decode_topk": decode_topk,
        "decode_out": decode_out,
    }
