"""What the plugin costs at startup: plugin loading and config creation.

Alternates child processes with the plugin loaded and excluded by
``VLLM_PLUGINS`` (the same installed packages otherwise), each on a simulated
MI355X with the MI355X launch script's flags (bundled MiniMax-M3 config,
``--kv-cache-dtype fp8``, TP 8, AITER sparse paged attention on). Each child
times vLLM's ``load_general_plugins()`` and then ``create_engine_config()``
(the first call, and the median of the warm calls after it). A pair's ratio is
with / without; the report gives the median ratio over pairs and its range.
A separate set of children times the plugin's own ``register()``.

``python -m benchmarks.plugin_overhead [--pairs 7] [--json] [--write-docs]``

``--write-docs`` puts the table in docs/performance.md between markers that
carry a fingerprint of the plugin's load path and hook sources
(``SOURCES``); ``tests/test_docs.py`` fails when those sources change and the
table was not regenerated, so the figures cannot drift silently.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks._common import run_child, table
from vllm_minimax_m3_kv_sim.environments import AITER_SPARSE_PA, STOCK_VLLM

WARM_CALLS = 60
REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs" / "performance.md"
SOURCES = (
    # What plugin load and the config hook run (register(), the registry, the
    # import hooks, the hook and the facts and decision it calls).
    "vllm_minimax_m3_kv/__init__.py",
    "vllm_minimax_m3_kv/_import_hooks.py",
    "vllm_minimax_m3_kv/_log.py",
    "vllm_minimax_m3_kv/_versions.py",
    "vllm_minimax_m3_kv/envs.py",
    "vllm_minimax_m3_kv/patches.py",
    "vllm_minimax_m3_kv/patch_sites.py",
    "vllm_minimax_m3_kv/v1/core/kv_cache_zeroing.py",
    "vllm_minimax_m3_kv/model_executor/models/config.py",
    *sorted(
        path.relative_to(REPO).as_posix()
        for path in (REPO / "vllm_minimax_m3_kv" / "config").glob("*.py")
    ),
)
BLOCK = re.compile(
    r"<!-- plugin_overhead begin sources=(?P<fingerprint>[0-9a-f]+) -->\n"
    r"(?P<table>.*?)<!-- plugin_overhead end -->",
    re.DOTALL,
)


def sources_fingerprint() -> str:
    """What the figures were measured on: the load path and hook sources."""
    digest = hashlib.sha256()
    for name in SOURCES:
        digest.update(name.encode() + b"\0" + (REPO / name).read_bytes())
    return digest.hexdigest()[:16]


def write_docs(rendered: str) -> None:
    """Replace the table in docs/performance.md with this run's."""
    text = DOCS.read_text()
    block = (
        f"<!-- plugin_overhead begin sources={sources_fingerprint()} -->\n"
        f"```\n{rendered}\n```\n<!-- plugin_overhead end -->"
    )
    new, count = BLOCK.subn(lambda _: block, text)
    if count != 1:
        raise SystemExit(f"{DOCS}: expected one plugin_overhead block, found {count}")
    DOCS.write_text(new)


RECIPE = {
    "kv_cache_dtype": "fp8",
    "tensor_parallel_size": 8,
    "language_model_only": True,
}


def measure_startup() -> dict[str, Any]:
    """In a child process: plugin loading, then config creation."""
    from vllm_minimax_m3_kv_sim import engine as sim
    from vllm_minimax_m3_kv_sim.hardware import simulate

    simulate("mi355x")
    from vllm.plugins import load_general_plugins

    start = time.perf_counter()
    load_general_plugins()
    load_seconds = time.perf_counter() - start

    def create() -> tuple[float, str]:
        args = sim.make_engine_args({**RECIPE, "model": sim.BUNDLED_MODEL})
        start = time.perf_counter()
        vllm_config = args.create_engine_config()
        return (
            time.perf_counter() - start,
            vllm_config.attention_config.indexer_kv_dtype,
        )

    first, indexer = create()
    hook_seconds, own_seconds = _time_plugin_hook()
    warm = [create()[0] for _ in range(WARM_CALLS)]
    return {
        "load_general_plugins_s": load_seconds,
        "create_engine_config_first_s": first,
        "create_engine_config_warm_s": statistics.median(warm),
        "indexer_kv_dtype": indexer,
        "plugin_hook_s": statistics.median(hook_seconds) if hook_seconds else None,
        "plugin_own_s": statistics.median(own_seconds) if own_seconds else None,
    }


def _time_plugin_hook() -> tuple[list[float], list[float]]:
    """Time, inside each warm create_engine_config, the MiniMax-M3 config
    hook entry (vLLM's own hook, then the plugin's) and the plugin's part."""
    from vllm.model_executor.models import config as models_config

    hook = models_config.MODELS_CONFIG_MAP["MiniMaxM3SparseForConditionalGeneration"]
    if not hasattr(hook, "stock_hook"):
        return [], []  # plugin excluded
    from vllm_minimax_m3_kv.model_executor.models import config as plugin_hook

    whole: list[float] = []
    own: list[float] = []
    verify = hook.verify_and_update_config
    apply = plugin_hook.apply_indexer_precision

    def timed(vllm_config: Any) -> None:
        start = time.perf_counter()
        verify(vllm_config)
        whole.append(time.perf_counter() - start)

    def timed_own(vllm_config: Any) -> None:
        start = time.perf_counter()
        apply(vllm_config)
        own.append(time.perf_counter() - start)

    hook.verify_and_update_config = staticmethod(timed)
    plugin_hook.apply_indexer_precision = timed_own
    return whole, own


def measure_register() -> dict[str, Any]:
    """In a child process: the plugin's own import and register()."""
    # What vLLM has imported when it loads plugins (EngineArgs.__post_init__).
    import vllm.engine.arg_utils  # noqa: F401

    start = time.perf_counter()
    import vllm_minimax_m3_kv

    vllm_minimax_m3_kv.register()
    return {"register_s": time.perf_counter() - start}


def _spread(values: list[float]) -> dict[str, float]:
    return {
        "median": round(statistics.median(values), 4),
        "min": round(min(values), 4),
        "max": round(max(values), 4),
    }


def run(pairs: int) -> dict[str, Any]:
    script = __spec__.name
    samples: dict[str, list[dict[str, Any]]] = {"with": [], "without": []}
    for _ in range(pairs):
        samples["with"].append(
            run_child(script, ["--what", "startup"], AITER_SPARSE_PA)
        )
        samples["without"].append(
            run_child(script, ["--what", "startup"], {**AITER_SPARSE_PA, **STOCK_VLLM})
        )
    registers = [
        run_child(script, ["--what", "register"], {})["register_s"]
        for _ in range(pairs)
    ]
    metrics = (
        "load_general_plugins_s",
        "create_engine_config_first_s",
        "create_engine_config_warm_s",
    )
    report: dict[str, Any] = {
        "pairs": pairs,
        "indexer_kv_dtype": {
            "with": samples["with"][0]["indexer_kv_dtype"],
            "without": samples["without"][0]["indexer_kv_dtype"],
        },
    }
    for metric in metrics:
        with_values = [s[metric] for s in samples["with"]]
        without_values = [s[metric] for s in samples["without"]]
        report[metric] = {
            "with_plugin": _spread(with_values),
            "without_plugin": _spread(without_values),
            "ratio": _spread(
                [w / o for w, o in zip(with_values, without_values, strict=True)]
            ),
        }
    report["register_ms"] = _spread([seconds * 1000 for seconds in registers])
    for name in ("plugin_hook", "plugin_own"):
        report[f"{name}_us"] = _spread([s[f"{name}_s"] * 1e6 for s in samples["with"]])
    return report


def render(report: dict[str, Any]) -> str:
    names = {
        "load_general_plugins_s": "vLLM load_general_plugins()",
        "create_engine_config_first_s": "create_engine_config(), first call",
        "create_engine_config_warm_s": f"create_engine_config(), warm (median of {WARM_CALLS})",
    }
    rows = []
    for metric, label in names.items():
        entry = report[metric]
        ratio = entry["ratio"]
        rows.append(
            [
                label,
                f"{entry['with_plugin']['median'] * 1000:.1f} ms",
                f"{entry['without_plugin']['median'] * 1000:.1f} ms",
                f"{ratio['median']:.3f}x ({ratio['min']:.3f}-{ratio['max']:.3f})",
            ]
        )
    register = report["register_ms"]
    hook = report["plugin_hook_us"]
    own = report["plugin_own_us"]
    dtype = report["indexer_kv_dtype"]
    return "\n\n".join(
        [
            f"Startup cost on simulated MI355X, MI355X recipe flags, {report['pairs']} "
            f"alternating pairs (indexer: {dtype['with']} with the plugin, "
            f"{dtype['without']} without)",
            table(
                ["step", "with plugin", "without", "ratio, median (min-max)"],
                rows,
            ),
            f"plugin import + register(): {register['median']:.1f} ms median "
            f"({register['min']:.1f}-{register['max']:.1f})",
            f"MiniMax-M3 config hook inside each create_engine_config(): "
            f"{hook['median']:.0f} us median ({hook['min']:.0f}-{hook['max']:.0f}), "
            f"of which the plugin's apply_indexer_precision(): {own['median']:.0f} us "
            f"({own['min']:.0f}-{own['max']:.0f})",
        ]
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--pairs", type=int, default=7, help="alternating with/without runs"
    )
    parser.add_argument("--json", action="store_true", help="print JSON instead")
    parser.add_argument(
        "--write-docs",
        action="store_true",
        help="also put the table in docs/performance.md",
    )
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument(
        "--what", choices=("startup", "register"), help=argparse.SUPPRESS
    )
    parser.add_argument("--out", help=argparse.SUPPRESS)
    options = parser.parse_args()
    if options.child:
        result = measure_startup() if options.what == "startup" else measure_register()
        Path(options.out).write_text(json.dumps(result))
        return
    report = run(options.pairs)
    print(json.dumps(report, indent=1) if options.json else render(report))
    if options.write_docs:
        write_docs(render(report))


if __name__ == "__main__":
    sys.exit(main())
