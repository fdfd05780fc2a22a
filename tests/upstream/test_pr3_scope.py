"""Upstream PR 3 changes what a layer builds only where stock vLLM 0.33 let
the order of layer construction decide: MiniMax-M3's sparse layers built
before its first dense one, and a PP stage with no dense layer, now get the
fp8 of the checkpoint's kv_cache_scheme as the rest of the model does.
Everything else builds as on stock, config hooks included (they still see
``auto``), and so does LFM2-MoE, a hybrid whose ``Attention`` layers get no
quantization config, on simulated A100 with the backend vLLM selects: round
3 turned it from bf16 to fp8 (``checkpoint_kv_scope.py``)."""

from __future__ import annotations

import pytest

from tests.upstream import overlay
from vllm_minimax_m3_kv_sim.plumbing.children import json_from_out_file

FP8 = "torch.uint8/FP8_PER_TENSOR"
BF16 = "torch.bfloat16/NONE"
MAIN = "language_model.model.layers.{}.self_attn.attn"
CHANGED = {
    "minimax_m3_sparse_first": {MAIN.format(0), MAIN.format(1)},
    "minimax_m3_pp2_sparse_stage": {MAIN.format(3), MAIN.format(4)},
}
"""The layers PR 3 builds differently, per scenario: bf16 on stock, fp8 now."""
SCENARIOS = {
    "minimax_m3_dense_first",
    "minimax_m3_sparse_first",
    "minimax_m3_pp2_sparse_stage",
    "llama",
    "lfm2_moe",
}


@pytest.fixture(scope="module")
def builds(tmp_path_factory) -> dict[str, dict]:
    pr3 = overlay.build(tmp_path_factory.mktemp("pr3"), overlay.PR3)
    env = overlay.child_env(pr3)
    stock = {**env, "PYTHONPATH": ""}
    del stock["VLLM_CACHE_ROOT"]  # stock vLLM's own
    results: dict[str, dict] = {"stock": {}, "pr3": {}}
    for platform in ("b300", "a100"):
        argv = ["-m", "tests.upstream.checkpoint_kv_scope", "--platform", platform]
        results["stock"].update(json_from_out_file(argv, stock))
        results["pr3"].update(json_from_out_file(argv, env))
    return results


def test_pr3_changes_only_the_layers_whose_build_order_decided(builds):
    stock, pr3 = builds["stock"], builds["pr3"]
    assert stock.keys() == pr3.keys() == SCENARIOS
    for name in stock:
        # What config hooks and the engine core see is unchanged.
        assert stock[name]["config_cache_dtype"] == "auto", name
        assert pr3[name]["config_cache_dtype"] == "auto", name
        before, after = stock[name]["layers"], pr3[name]["layers"]
        assert before.keys() == after.keys(), name
        changed = {layer for layer in before if before[layer] != after[layer]}
        assert changed == CHANGED.get(name, set()), (name, before, after)
        for layer in changed:
            assert (before[layer], after[layer]) == (BF16, FP8), layer


def test_the_changed_layers_get_what_stock_gave_the_rest_of_the_model(builds):
    # Unsplit and dense-first, stock already built every main cache fp8.
    for name in ("minimax_m3_dense_first", "llama"):
        layers = builds["stock"][name]["layers"]
        main = {v for k, v in layers.items() if not k.endswith("index_cache")}
        assert main == {FP8}, name
    # LFM2-MoE's attention layers are built without the quantization config:
    # bf16 on both, its convolution state untouched.
    for build in builds.values():
        layers = build["lfm2_moe"]["layers"]
        attention = {v for k, v in layers.items() if k.endswith("self_attn.attn")}
        assert attention == {BF16}
    # Index caches are not main caches: PR 3 leaves them to PR 1.
    for build in builds.values():
        for scenario in build.values():
            for layer, spec in scenario["layers"].items():
                if layer.endswith("index_cache"):
                    assert spec == BF16, layer


def test_pr3_touches_no_layer_but_attention_and_minimax_m3s_sparse_attention():
    """What is not built here (MLA: the simulated CUDA platform cannot build
    its backends on a CPU) is out of PR 3's reach: the helper is asked only
    by Attention.__init__ and MiniMax-M3's sparse attention."""
    (patch,) = overlay.PR3
    assert {p for p in overlay.touched_paths(patch) if p.startswith("vllm/")} == {
        "vllm/model_executor/layers/attention/attention.py",
        "vllm/models/minimax_m3/nvidia/model.py",
        "vllm/models/minimax_m3/amd/model.py",
    }
