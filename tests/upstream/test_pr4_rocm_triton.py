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
