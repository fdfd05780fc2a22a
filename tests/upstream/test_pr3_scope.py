"""Upstream PR 3 changes what a layer builds only where stock vLLM's
``Attention.__init__`` already made the model's KV cache fp8: its sparse
layers built before the first dense one, and a PP stage with no dense layer,
now get the fp8 the rest of the model gets. Everything else builds as on
stock; config hooks now see ``fp8`` instead of ``auto``
(``checkpoint_kv_scope.py``)."""

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


@pytest.fixture(scope="module")
def builds(tmp_path_factory) -> dict[str, dict]:
    pr3 = overlay.build(tmp_path_factory.mktemp("pr3"), overlay.PR3)
    env = overlay.child_env(pr3)
    stock = {**env, "PYTHONPATH": ""}
    del stock["VLLM_CACHE_ROOT"]  # stock vLLM's own
    argv = ["-m", "tests.upstream.checkpoint_kv_scope"]
    return {
        "stock": json_from_out_file(argv, stock),
        "pr3": json_from_out_file(argv, env),
    }


@pytest.mark.slow
def test_pr3_changes_only_the_layers_built_before_vllm_applied_the_scheme(builds):
    stock, pr3 = builds["stock"], builds["pr3"]
    assert stock.keys() == pr3.keys() and len(stock) == 4
    for name in stock:
        assert stock[name]["config_cache_dtype"] == "auto", name
        assert pr3[name]["config_cache_dtype"] == "fp8", name
        before, after = stock[name]["layers"], pr3[name]["layers"]
        assert before.keys() == after.keys(), name
        changed = {layer for layer in before if before[layer] != after[layer]}
        assert changed == CHANGED.get(name, set()), (name, before, after)
        for layer in changed:
            assert (before[layer], after[layer]) == (BF16, FP8), layer


@pytest.mark.slow
def test_the_changed_layers_get_what_stock_gave_the_rest_of_the_model(builds):
    # Unsplit and dense-first, stock already built every main cache fp8.
    for name in ("minimax_m3_dense_first", "llama"):
        layers = builds["stock"][name]["layers"]
        main = {v for k, v in layers.items() if not k.endswith("index_cache")}
        assert main == {FP8}, name
    # Index caches are not main caches: PR 3 leaves them to PR 1.
    for build in builds.values():
        for scenario in build.values():
            for layer, spec in scenario["layers"].items():
                if layer.endswith("index_cache"):
                    assert spec == BF16, layer
