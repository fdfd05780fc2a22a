"""The test scaffolding's own promises: forked children start as fresh
interpreters would for what decides anything (vLLM, this plugin, the stand-ins
are imported there, not inherited), and patched vLLM keeps caches apart from
stock vLLM's.
"""

from __future__ import annotations

import json
from pathlib import Path

from tests.upstream import overlay
from vllm_minimax_m3_kv_sim.plumbing.children import PRELOAD, json_from_stdout

DECIDES = (
    "vllm",
    "vllm_minimax_m3_kv",
    "amdsmi",
    "aiter",
    "vllm_minimax_m3_kv_sim.hardware",
)


def test_a_forked_child_imports_vllm_and_the_plugin_itself():
    seen = json_from_stdout(
        [
            "-c",
            "import json, os, sys\n"
            f"decides = {DECIDES!r}\n"
            "print(json.dumps({\n"
            "    'inherited': sorted(m for m in sys.modules\n"
            "        if m.split('.')[0] in decides or m in decides),\n"
            "    'preloaded': sorted(set(sys.modules) & set(json.loads(\n"
            "        os.environ['PRELOAD']))),\n"
            "    'variable': os.environ.get('ONLY_THIS_CHILD'),\n"
            "}))",
        ],
        {"PRELOAD": json.dumps(PRELOAD), "ONLY_THIS_CHILD": "1"},
    )
    assert seen["inherited"] == []
    # The point of the server: the rest is already there.
    assert seen["preloaded"] == sorted(PRELOAD)
    assert seen["variable"] == "1"


def test_patched_vllms_keep_vllm_caches_apart_from_stock_and_each_other(tmp_path):
    """vLLM caches model-class facts in one file per class, keyed by the model
    package's files: two trees sharing one cache would evict each other's."""
    roots = {
        name: overlay.child_env(overlay.build(tmp_path / name, patches))[
            "VLLM_CACHE_ROOT"
        ]
        for name, patches in (
            ("pr1", overlay.PR1),
            ("pr1_again", overlay.PR1),
            ("pr1_pr3", overlay.PR1_PR3),
        )
    }
    assert roots["pr1"] == roots["pr1_again"]  # reused across runs
    assert roots["pr1"] != roots["pr1_pr3"]
    stock = json_from_stdout(
        ["-c", "import json, vllm.envs as e; print(json.dumps(e.VLLM_CACHE_ROOT))"]
    )
    for root in roots.values():
        assert Path(root).is_relative_to(overlay.PATCHED_VLLM_CACHE_ROOT)
        assert not Path(root).is_relative_to(stock)
        assert not Path(stock).is_relative_to(root)
