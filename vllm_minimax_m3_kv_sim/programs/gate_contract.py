"""Ask vLLM's own fp8-indexer gates and the plugin's policy the same questions.

``python -m vllm_minimax_m3_kv_sim.programs.gate_contract PLATFORM`` prints one JSON list of
``[case, vllm_says_fp8_runs, policy_says_fp8_runs, stock_vllm_says]`` rows:
vLLM with this plugin loaded (its gate entry applied), the policy, and vLLM's
own gates alone (the plugin's wrappers bypassed).
"""

from __future__ import annotations

import itertools
import json
import os
import sys

from vllm_minimax_m3_kv_sim.hardware import refresh_rocm_env, simulate

SHAPES = [
    {},
    {"topk_blocks": 32},
    {"sparse_block_size": 64},
    {"index_head_dim": 64},
    {"score_type": "sum"},
]
LENGTHS = [8192, 128 * 64 * 128, 128 * 64 * 128 + 1]


def _vllm_msa(shape: dict, max_model_len: int) -> bool:
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


def _vllm_select(shape: dict, stock: bool) -> bool:
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.models.minimax_m3.common import indexer

    select_indexer_impl_cls = indexer.select_indexer_impl_cls
    if stock:
        select_indexer_impl_cls = getattr(
            select_indexer_impl_cls, "__wrapped__", select_indexer_impl_cls
        )
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
    # The gate entry runs the node self-test before selecting; this asks the
    # gate alone (tests/kernels runs the self-test).
    os.environ["VLLM_MINIMAX_M3_KV_SKIP_SELFTEST"] = "1"
    from vllm.plugins import load_general_plugins

    load_general_plugins()
    from vllm_minimax_m3_kv.config.facts import live_platform_facts
    from vllm_minimax_m3_kv.config.indexer_precision import decide
    from vllm_minimax_m3_kv.config.pool_facts import PrecisionFacts, SparseShape
    from vllm_minimax_m3_kv.config.verdicts import Outcome

    rows = []
    for aiter, shuffle, shape, length in itertools.product("01", "01", SHAPES, LENGTHS):
        os.environ["VLLM_ROCM_USE_AITER"] = aiter
        os.environ["VLLM_ROCM_SHUFFLE_KV_CACHE_LAYOUT"] = shuffle
        refresh_rocm_env()
        live = live_platform_facts()
        # On ROCm vLLM selects the MSA indexer where its contract holds, else
        # the neutral indexer's own selection.
        msa = live.vendor == "rocm" and _vllm_msa(shape, length)
        vllm_runs = msa or _vllm_select(shape, stock=False)
        stock_runs = msa or _vllm_select(shape, stock=True)
        facts = PrecisionFacts(
            platform=live,
            kv_cache_dtype="fp8",
            indexer_kv_dtype="fp8",
            max_model_len=length,
            shape=SparseShape(**shape),
        )
        policy_runs = decide(facts).outcome is not Outcome.ERROR
        case = {"aiter": aiter, "shuffle": shuffle, "shape": shape, "len": length}
        rows.append([case, vllm_runs, policy_runs, stock_runs])
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
