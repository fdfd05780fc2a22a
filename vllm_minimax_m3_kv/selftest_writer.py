"""The node self-test's writer half: the plugin's fnuz index writer on gfx942.

On gfx942 the plugin's writer (``minimax_m3_rocm_fnuz_index_writer``) fills
the e4m3fnuz index cache and query; here it runs on this GPU on keys and
queries with outliers past vLLM's fnuz range and a NaN each, and its bytes are
compared with torch's clamp-and-cast of the same values, padded slots left
untouched. Elsewhere it says why it did not run (:data:`.selftest.WRITER_NOT_RUN`).
"""

from __future__ import annotations

import math
from typing import Any

from vllm_minimax_m3_kv.selftest import (
    E4M3FNUZ,
    HOST,
    SPARSE_BLOCK,
    WRITER_NOT_RUN,
    WRITER_NOT_RUN_ON_CPU,
    Fp8Format,
    Result,
    _generator,
    _rms_normed,
    e4m3,
)

WRITER_TOKENS = 256
WRITER_OUTLIERS = (1000.0, -1000.0, 224.0, -224.0, 225.0, 239.9, -3e4)
"""Past, at and just over vLLM's fnuz range: each must be stored as +-224."""


def writer_inputs(fmt: Fp8Format, seed: int = 0) -> dict[str, Any]:
    """Index keys and queries as the fused op leaves them (bf16, normed),
    some past the fp8 range, one NaN each, and a slot mapping with padded
    (-1) slots."""
    import torch

    generator = _generator(seed)
    keys = _rms_normed(generator, WRITER_TOKENS, 128)
    queries = _rms_normed(generator, WRITER_TOKENS, 256)
    for i, value in enumerate(WRITER_OUTLIERS):
        keys[3 * i + 1, i] = value
        queries[5 * i + 2, 2 * i] = value
    # NaN is stored as NaN, as torch's clamp-and-cast stores it (never +-max).
    keys[WRITER_TOKENS - 2, 5] = math.nan
    queries[WRITER_TOKENS - 2, 7] = math.nan
    slots = torch.randperm(4 * SPARSE_BLOCK, generator=generator, device=HOST)
    slots = slots[:WRITER_TOKENS]
    slots[::17] = -1  # padded tokens (CUDA-graph padding): nothing stored
    return {
        "keys": keys.to(torch.bfloat16),
        "queries": queries.to(torch.bfloat16),
        "slots": slots,
    }


STALE_MARK = 0x80
"""What the cache holds before the write: fnuz NaN, so a byte the writer
should have left alone, or written, shows."""


def run_writer(inputs: dict[str, Any], fmt: Fp8Format, device: str) -> dict[str, Any]:
    """The plugin's fnuz writer on ``device``: the cache (4 blocks) and the
    query buffer it fills."""
    import torch

    from vllm_minimax_m3_kv.model_executor.models.minimax_m3_rocm_fnuz_index_writer import (
        clamp_cast_index,
    )

    cache = torch.full(
        (4, SPARSE_BLOCK, 128), STALE_MARK, dtype=torch.uint8, device=device
    ).view(fmt.torch_dtype)
    query_out = torch.empty(
        inputs["queries"].shape, dtype=fmt.torch_dtype, device=device
    )
    clamp_cast_index(
        inputs["keys"].to(device),
        inputs["queries"].to(device),
        cache,
        query_out,
        inputs["slots"].to(device),
        fmt.max,
    )
    return {"cache": cache.cpu(), "queries": query_out.cpu()}


def judge_writer(
    inputs: dict[str, Any], written: dict[str, Any], fmt: Fp8Format
) -> list[str]:
    """The writer's bytes against torch's clamp-and-cast of the same values;
    slots no token maps to left as they were."""
    import torch

    failures = []
    slots = inputs["slots"]
    kept = slots >= 0
    cache = written["cache"].view(torch.uint8).view(-1, 128)
    want_keys = e4m3(inputs["keys"], fmt).view(torch.uint8)
    off = (cache[slots[kept]] != want_keys[kept]).sum()
    if off:
        failures.append(f"writer: {int(off)} index-key bytes differ from torch's cast")
    untouched = torch.ones(cache.shape[0], dtype=torch.bool, device=HOST)
    untouched[slots[kept]] = False
    if (cache[untouched] != STALE_MARK).any():
        failures.append("writer: bytes changed in slots no token maps to")
    want_queries = e4m3(inputs["queries"], fmt).view(torch.uint8)
    off = (written["queries"].view(torch.uint8) != want_queries).sum()
    if off:
        failures.append(
            f"writer: {int(off)} index-query bytes differ from torch's cast"
        )
    return failures


def check_writer(result: Result, device: str, fmt: Fp8Format) -> str:
    """The writer half, where it runs; returns its verdict clause."""
    if fmt != E4M3FNUZ:
        return WRITER_NOT_RUN
    if device == "cpu":
        return WRITER_NOT_RUN_ON_CPU
    inputs = writer_inputs(fmt)
    failures = judge_writer(inputs, run_writer(inputs, fmt, device), fmt)
    result.failures += failures
    result.checked += 1
    largest = max(
        float(inputs[name].float().nan_to_num(0.0).abs().max())
        for name in ("keys", "queries")
    )
    clamped = sum(
        int((inputs[name].float().abs() > fmt.max).sum())
        for name in ("keys", "queries")
    )
    verdict = "as torch's clamp-and-cast" if not failures else "WRONG"
    return (
        f"writer: the plugin's fnuz index writer {verdict} ({clamped} synthetic "
        f"outliers up to {largest:g} clamped to +-{fmt.max:g})"
    )
