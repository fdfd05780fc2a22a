"""The long-context eval pair drafted for upstream PR 1 (``upstream/evals/``)
is one vLLM's own MRCR harness runs: it uses the keys that harness reads (in
vLLM's v0.33.0 source release), its server arguments parse with ``vllm
serve``'s parser and build the caches the pair is named for, and the two
configs differ in the index cache alone."""

from __future__ import annotations

import ast

import pytest
import yaml

from tests.upstream import overlay, precommit
from vllm_minimax_m3_kv_sim.plumbing.children import json_from_out_file

EVALS = overlay.REPO / "upstream" / "evals" / "mrcr"
PAIR = {
    side: EVALS / f"MiniMax-M3-MXFP8-FP8-KV-{side}-index-cache_MI355.yaml"
    for side in ("bf16", "fp8")
}
INDEXER_WINDOW = 16 * 128
"""Tokens MiniMax-M3's indexer keeps (top 16 blocks of 128): shorter prompts
select every block whatever the index cache holds."""


def _harness_keys() -> tuple[set[str], set[str]]:
    """(keys vLLM's MRCR test requires, keys it reads at all) from its source."""
    source = precommit.pristine_source() / "tests/evals/mrcr/test_mrcr_correctness.py"
    required, optional = set(), set()
    for node in ast.walk(ast.parse(source.read_text())):
        if (
            isinstance(node, ast.Subscript)
            and isinstance(node.value, ast.Name)
            and node.value.id == "cfg"
            and isinstance(node.slice, ast.Constant)
        ):
            required.add(node.slice.value)
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "get"
            and isinstance(node.func.value, ast.Name)
            and node.func.value.id == "cfg"
        ):
            optional.add(node.args[0].value)
    return required, required | optional


def _load(side: str) -> dict:
    return yaml.safe_load(PAIR[side].read_text())


def test_the_pair_uses_the_keys_vllms_mrcr_harness_reads():
    required, read = _harness_keys()
    assert {"model_name", "match_ratio_threshold"} <= required
    for side in PAIR:
        config = _load(side)
        assert required <= config.keys() <= read, (side, config.keys() - read)


def test_the_pair_differs_in_the_index_cache_alone():
    bf16, fp8 = _load("bf16"), _load("fp8")
    flag = "--attention-config.indexer_kv_dtype"
    assert f"{flag} bf16" in bf16["server_args"]
    assert (
        bf16["server_args"].replace(f"{flag} bf16", f"{flag} fp8")
        == (fp8["server_args"])
    )
    assert {k: v for k, v in bf16.items() if k != "server_args"} == {
        k: v for k, v in fp8.items() if k != "server_args"
    }
    # One node of a checkpoint that fits it, not the 854 GB BF16 one.
    assert bf16["model_name"] == "MiniMaxAI/MiniMax-M3-MXFP8"


@pytest.mark.parametrize("side", list(PAIR))
def test_vllm_builds_the_caches_each_config_is_named_for(side):
    # Stock vLLM 0.33, the plugin excluded: the pair names both dtypes, so it
    # builds the same with PR 1 or without it.
    env = {"VLLM_PLUGINS": "lora_filesystem_resolver"}
    argv = ["-m", "tests.upstream.eval_configs", "--config", str(PAIR[side])]
    built = json_from_out_file(argv, env)
    assert built["kv_cache_dtype"] == "fp8"
    assert built["indexer_kv_dtype"] == side
    assert built["tensor_parallel_size"] == 4
    assert built["reasoning_parser"] == "minimax_m3"
    # MRCR fills the context it is given: far past the indexer's window.
    assert built["max_model_len"] >= 32 * INDEXER_WINDOW
