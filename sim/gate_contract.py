"""Ask vLLM's own fp8-indexer gates and the plugin's policy the same questions.

``python -m sim.gate_contract PLATFORM`` prints one JSON list of
``[case, vllm_says_fp8_runs, policy_says_fp8_runs]`` rows.
"""

from __future__ import annotations

import itertools
import json
import os
import sys

from sim.hardware import refresh_rocm_env, simulate

SHAPES = [
    {},
    {"topk_blocks": 32},
    {"sparse_block_size": 64},
    {"index_head_dim": 64},
    {"score_type": "sum"},
]
LENGTHS = [8192, 128 * 64 * 128, 128 * 64 * 128 + 1]


def _vllm_rocm(shape: dict, max_model_len: int) -> bool:
    from vllm.models.minimax_m3.amd.indexer_msa import msa_indexer_unsupported_reason

    full = {
        "topk_blocks": 16,
        "sparse_block_size": 128,
        "index_head_dim": 128,
        "score_type": "max",
        **shape,
    }
    return (
        msa_indexer_unsupported_reason(
            indexer_kv_dtype="fp8", max_model_len=max_model_len, **full
        )
        is None
    )


def _vllm_cuda(shape: dict) -> bool:
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.models.minimax_m3.common.indexer import select_indexer_impl_cls

    with set_current_vllm_config(VllmConfig()):
        try:
            select_indexer_impl_cls(
                topk_blocks=shape.get("topk_blocks", 16), indexer_kv_dtype="fp8"
            )
        except (NotImplementedError, ValueError):
            return False
    return True


def main() -> None:
    platform = sys.argv[1]
    simulate(platform)
    from vllm_minimax_m3_kv.config.facts import live_platform_facts
    from vllm_minimax_m3_kv.config.indexer_precision import (
        Outcome,
        PrecisionFacts,
        SparseShape,
        decide,
    )

    rows = []
    for aiter, shuffle, shape, length in itertools.product("01", "01", SHAPES, LENGTHS):
        os.environ["VLLM_ROCM_USE_AITER"] = aiter
        os.environ["VLLM_ROCM_SHUFFLE_KV_CACHE_LAYOUT"] = shuffle
        refresh_rocm_env()
        live = live_platform_facts()
        if live.vendor == "rocm":
            vllm_runs = _vllm_rocm(shape, length)
        else:
            vllm_runs = _vllm_cuda(shape)
        facts = PrecisionFacts(
            platform=live,
            kv_cache_dtype="fp8",
            indexer_kv_dtype="fp8",
            max_model_len=length,
            shape=SparseShape(**shape),
        )
        policy_runs = decide(facts).outcome is not Outcome.ERROR
        case = {"aiter": aiter, "shuffle": shuffle, "shape": shape, "len": length}
        rows.append([case, vllm_runs, policy_runs])
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
