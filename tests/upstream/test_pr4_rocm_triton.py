"""Upstream PR 4 opens vLLM's Triton indexer to an fp8 index cache on gfx950,
target and MTP drafter alike, where stock vLLM 0.33 refuses it at model build;
gfx942 stays refused (its fp8 is e4m3fnuz, which vLLM's fused index insert
does not write). Each build is vLLM's real model construction on the meta
device under a simulated GPU (``pr4_build.py``)."""

from __future__ import annotations

import pytest

from tests.upstream import overlay
from vllm_minimax_m3_kv_sim.plumbing.children import json_from_out_file

TRITON = ["MiniMaxM3IndexerTritonImpl"]
STOCK_REFUSAL = "indexer_kv_dtype='fp8' requires CUDA fp8 support."


@pytest.fixture(scope="module")
def envs(tmp_path_factory) -> dict[str, dict[str, str]]:
    pr4 = overlay.build(tmp_path_factory.mktemp("pr4"), overlay.PR4)
    env = overlay.child_env(pr4)
    stock = {**env, "PYTHONPATH": ""}
    del stock["VLLM_CACHE_ROOT"]  # stock vLLM's own
    return {"pr4": env, "stock": stock}


def _build(env: dict[str, str], platform: str) -> dict:
    return json_from_out_file(
        ["-m", "tests.upstream.pr4_build", "--platform", platform], env
    )


def test_gfx950_builds_the_triton_indexer_on_fp8_for_target_and_drafter(envs):
    built = _build(envs["pr4"], "mi355x")
    assert built == {
        "indexer_impls": TRITON,
        "draft_indexer_impls": TRITON,
        "index_cache_dtypes": ["torch.float8_e4m3fn"],
    }
    stock = _build(envs["stock"], "mi355x")
    assert stock["error"]["type"] == "NotImplementedError"
    assert stock["error"]["message"] == STOCK_REFUSAL


def test_gfx942_is_still_refused_and_the_message_says_where_fp8_runs(envs):
    built = _build(envs["pr4"], "mi300x")
    assert built["error"]["type"] == "NotImplementedError"
    assert built["error"]["message"] == (
        "indexer_kv_dtype='fp8' requires CUDA fp8 support or ROCm gfx950."
    )


def test_pr4s_kernel_cases_pass_on_rocms_scorers_at_every_serving_shape(
    tmp_path_factory,
):
    """The cases vLLM's MI355 step would run, on gfx950's scorers under
    Triton's interpreter: heads 1 and 4 by decode query length 1 of 1, 1 of 2
    and 2 of 2, and prefill at heads 1 and 4 (round 4 ran one shape)."""
    from tests.upstream import precommit
    from vllm_minimax_m3_kv_sim.kernels import kernel_env

    pr4 = overlay.build(tmp_path_factory.mktemp("pr4_kernels"), overlay.PR4)
    tests = overlay.vllm_test_tree(pr4, precommit.pristine_source())
    result = json_from_out_file(
        ["-m", "tests.upstream.pr4_kernel_cases", "--tests", str(tests)],
        {**overlay.child_env(pr4), **kernel_env()},
        timeout=1800,
    )
    assert result["scorers"] == "vllm.models.minimax_m3.amd.ops.index_topk"
    decode = "test_fp8_index_query_and_cache_decode_topk_matches_bf16"
    prefill = "test_fp8_index_query_and_cache_prefill_topk_matches_bf16"
    assert result["cases"] == {
        **{
            f"{decode}[h{heads}-q{q_len}of{max_q_len}]": "passed"
            for heads in (1, 4)
            for q_len, max_q_len in ((1, 1), (1, 2), (2, 2))
        },
        **{f"{prefill}[{heads}]": "passed" for heads in (1, 4)},
    }
