"""Plugin load: registry contents, idempotence, cost, version guard.

Each check runs in a fresh interpreter, since vLLM loads plugins once per
process and the point is what loading does to a clean one.
"""

from __future__ import annotations

import json
import textwrap

from vllm_minimax_m3_kv_sim import REPO
from vllm_minimax_m3_kv_sim.plumbing.children import json_from_stdout
from vllm_minimax_m3_kv_sim.plumbing.children import run_python as fork_python


def run_python(code: str, env: dict[str, str] | None = None) -> dict:
    return json_from_stdout(["-c", textwrap.dedent(code)], env, timeout=300)


def test_every_patch_is_declared_and_recognised():
    from vllm_minimax_m3_kv import patches

    assert patches.unsupported_reasons() == []
    for patch in patches.PATCHES:
        for field in ("why", "how", "upstream", "remove_when"):
            assert len(getattr(patch, field)) > 40, (patch.name, field)
        assert patch.detect() is None, patch.name
        # Stock 0.33 has none of the upstream fix: every entry is needed.
        assert patch.superseded() is None, patch.name


def test_load_twice_is_cheap_idempotent_and_imports_no_model_code():
    result = run_python(
        """
        import json, sys, time
        import vllm.plugins, vllm.model_executor.models.config as c
        stock = c.MODELS_CONFIG_MAP["MiniMaxM3SparseForConditionalGeneration"]
        start = time.perf_counter()
        vllm.plugins.load_general_plugins()
        elapsed = time.perf_counter() - start
        import vllm_minimax_m3_kv
        first = dict(c.MODELS_CONFIG_MAP)
        vllm_minimax_m3_kv.register()
        vllm_minimax_m3_kv.register()
        hook = c.MODELS_CONFIG_MAP["MiniMaxM3SparseForConditionalGeneration"]
        import torch
        print(json.dumps({
            "seconds": elapsed,
            "same_after_reload": first == dict(c.MODELS_CONFIG_MAP),
            "wraps_stock": hook.stock_hook is stock,
            "hooked": sorted(a for a, h in c.MODELS_CONFIG_MAP.items()
                             if hasattr(h, "stock_hook")),
            "model_modules": sorted(m for m in sys.modules
                                    if m.startswith("vllm.models.minimax_m3")),
            "cuda_initialized": torch.cuda.is_initialized(),
        }))
        """
    )
    assert result["same_after_reload"]
    assert result["wraps_stock"]
    assert result["hooked"] == [
        "MiniMaxM3MTP",
        "MiniMaxM3SparseForCausalLM",
        "MiniMaxM3SparseForConditionalGeneration",
    ]
    assert result["model_modules"] == []
    assert result["cuda_initialized"] is False
    assert result["seconds"] < 2.0  # the benchmark measures it properly


def test_indexer_patch_applies_when_the_model_module_is_imported():
    result = run_python(
        """
        import json
        import vllm_minimax_m3_kv
        vllm_minimax_m3_kv.register()
        from vllm.models.minimax_m3.common import indexer
        cache = indexer.MiniMaxM3IndexerCache
        vllm_minimax_m3_kv.register()
        import sys
        print(json.dumps({
            "spec": hasattr(cache.get_kv_cache_spec, "__wrapped__"),
            "bind": hasattr(cache.bind_kv_cache, "__wrapped__"),
            "single": not hasattr(cache.get_kv_cache_spec.__wrapped__, "__wrapped__"),
            "selection": hasattr(indexer.select_indexer_impl_cls, "__wrapped__"),
            # Off ROCm the self-test is never asked for, so never imported.
            "selftest": sorted(m for m in sys.modules
                               if m.startswith("vllm_minimax_m3_kv.selftest")),
        }))
        """
    )
    assert result == {
        "spec": True,
        "bind": True,
        "single": True,
        "selection": True,
        "selftest": [],
    }


def test_the_import_hook_leaves_the_import_path_once_nothing_is_awaited():
    result = run_python(
        """
        import json, pathlib, sys, tempfile
        from vllm_minimax_m3_kv import _import_hooks
        here = tempfile.mkdtemp()
        pathlib.Path(here, "awaited_probe.py").write_text("")
        sys.path.insert(0, here)
        seen = []
        _import_hooks.when_imported("awaited_probe", lambda m: seen.append(m.__name__))
        waiting = _import_hooks._finder in sys.meta_path
        import awaited_probe
        print(json.dumps({
            "seen": seen,
            "waiting": waiting,
            "after": _import_hooks._finder in sys.meta_path,
        }))
        """
    )
    assert result == {"seen": ["awaited_probe"], "waiting": True, "after": False}


def test_unsupported_vllm_logs_one_warning_and_changes_nothing():
    result = run_python(
        """
        import json, logging
        from importlib import metadata
        real = metadata.version
        metadata.version = lambda name: "0.34.1" if name == "vllm" else real(name)
        import vllm.model_executor.models.config as c
        before = dict(c.MODELS_CONFIG_MAP)
        records = []
        class Keep(logging.Handler):
            def emit(self, record):
                records.append(record)
        logging.getLogger("vllm.vllm_minimax_m3_kv").addHandler(Keep())
        import vllm_minimax_m3_kv
        vllm_minimax_m3_kv.register()
        vllm_minimax_m3_kv.register()
        print(json.dumps({
            "unchanged": before == dict(c.MODELS_CONFIG_MAP),
            "warnings": [r.getMessage() for r in records
                         if r.levelno == logging.WARNING],
        }))
        """
    )
    assert result["unchanged"]
    assert len(result["warnings"]) == 1
    assert "0.34.1" in result["warnings"][0]
    assert "pip install 'vllm>=0.33,<0.34'" in result["warnings"][0]


_LOAD_AND_DECIDE = """
import json, multiprocessing, sys
sys.path.insert(0, {repo!r})


def load_and_decide(_=None):
    from vllm_minimax_m3_kv_sim.hardware import simulate
    simulate("mi355x")
    from vllm_minimax_m3_kv_sim import engine as sim
    import vllm.plugins, vllm_minimax_m3_kv

    vllm.plugins.load_general_plugins()
    vllm_minimax_m3_kv.register()
    dtypes = [
        sim.make_engine_args({{"kv_cache_dtype": "fp8", "max_model_len": 8192}})
        .create_engine_config().attention_config.indexer_kv_dtype
        for _ in range(2)
    ]
    return {{"dtypes": dtypes}}


if __name__ == "__main__":
    here = load_and_decide()
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        child = pool.map(load_and_decide, [None])[0]
    print(json.dumps({{"here": here, "child": child}}), flush=True)
"""


def test_loaded_twice_and_in_a_spawned_child_same_verdict_one_log_line(tmp_path):
    script = tmp_path / "load_and_decide.py"
    script.write_text(_LOAD_AND_DECIDE.format(repo=str(REPO)))
    env = {"VLLM_ROCM_USE_AITER": "1", "VLLM_ROCM_SHUFFLE_KV_CACHE_LAYOUT": "1"}
    proc = fork_python([str(script)], env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["here"] == result["child"] == {"dtypes": ["fp8", "fp8"]}
    # What the user sees: vLLM's log lines, each tagged with its process.
    lines = [
        line.split(")")[0]
        for line in (proc.stdout + proc.stderr).splitlines()
        if "MiniMax-M3 indexer_kv_dtype=fp8 (inherited" in line
    ]
    assert len(lines) == 2 and len(set(lines)) == 2, lines


_ZEROING_PROBE = """
    import copy, json, pickle
    {first}
    import vllm.plugins
    vllm.plugins.load_general_plugins()
    {second}
    import vllm.envs as envs
    import vllm.v1.core.kv_cache_planning as planning
    import vllm.v1.engine.core as core
    from vllm.platforms.interface import Platform
    from vllm.v1.kv_cache_interface import KVCacheConfig

    config = KVCacheConfig(num_blocks=1, kv_cache_tensors=[], kv_cache_groups=[])
    computed = config.needs_kv_cache_zeroing
    config.__dict__["_minimax_m3_kv_needs_zeroing"] = True
    try:
        Platform.validate_environ(hard_fail=True)
        strict_env = "accepted"
    except ValueError as error:
        strict_env = str(error)
    print(json.dumps({{
        "core_wrapped": hasattr(core.get_kv_cache_configs, "__wrapped__"),
        "planner_wrapped": hasattr(planning.get_kv_cache_configs, "__wrapped__"),
        "computed": computed,
        "stored": config.needs_kv_cache_zeroing,
        "deepcopy": copy.deepcopy(config).needs_kv_cache_zeroing,
        "pickled": pickle.loads(pickle.dumps(config)).needs_kv_cache_zeroing,
        "opt_in": getattr(envs, "VLLM_MINIMAX_M3_KV_ALLOW_MIXED", None),
        "strict_env": strict_env,
    }}))
"""


def test_zeroing_decision_reaches_the_engine_core_whichever_imports_first():
    # The engine-core process imports vllm.v1.engine.core (which binds the
    # planner by name) before it loads plugins; the front end the other way.
    env = {"VLLM_MINIMAX_M3_KV_ALLOW_MIXED": "1"}
    core_first = run_python(
        _ZEROING_PROBE.format(first="import vllm.v1.engine.core", second=""), env
    )
    plugin_first = run_python(
        _ZEROING_PROBE.format(first="", second="import vllm.v1.engine.core"), env
    )
    for result in (core_first, plugin_first):
        assert result["core_wrapped"] and result["planner_wrapped"], result
        # No stored decision: vLLM's own computation; stored: it survives the
        # scheduler's deepcopy and pickling to workers.
        assert result["computed"] is False
        assert result["stored"] and result["deepcopy"] and result["pickled"]
        # vLLM knows the opt-in, even under --fail-on-environ-validation.
        assert result["opt_in"] is True
        assert result["strict_env"] == "accepted", result["strict_env"]


def test_without_the_plugin_vllm_strict_env_validation_refuses_the_opt_in():
    # What the env-table registry entry exists for: the stock failure.
    result = run_python(
        _ZEROING_PROBE.format(first="", second=""),
        {"VLLM_MINIMAX_M3_KV_ALLOW_MIXED": "1", "VLLM_PLUGINS": "none"},
    )
    assert not result["core_wrapped"] and result["opt_in"] is None
    assert "VLLM_MINIMAX_M3_KV_ALLOW_MIXED" in result["strict_env"]


def test_operator_can_grep_active_and_pool_lines():
    # As in `vllm serve`: logging is configured before plugins load.
    proc = fork_python(
        [
            "-c",
            textwrap.dedent(
                """
                import torch
                from vllm.config.logging import LoggingConfig
                from vllm.logger import configure_logging
                configure_logging(LoggingConfig())
                import vllm.plugins
                vllm.plugins.load_general_plugins()
                from vllm.v1.kv_cache_interface import (
                    FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec,
                    MLAAttentionSpec, get_kv_quant_mode)
                from vllm_minimax_m3_kv.v1.core.kv_cache_zeroing import log_pool

                fp8 = dict(dtype=torch.uint8, kv_quant_mode=get_kv_quant_mode("fp8"))
                main = FullAttentionSpec(block_size=128, num_kv_heads=1, head_size=128, **fp8)
                index = MLAAttentionSpec(block_size=128, num_kv_heads=1, head_size=128, **fp8)
                bf16 = MLAAttentionSpec(block_size=128, num_kv_heads=1, head_size=128,
                                        dtype=torch.bfloat16)
                def config(*specs):
                    groups = [KVCacheGroupSpec([f"l{i}"], s) for i, s in enumerate(specs)]
                    return KVCacheConfig(num_blocks=1, kv_cache_tensors=[],
                                         kv_cache_groups=groups)
                log_pool([config(main, index)] * 8, zeroing=False)
                log_pool([config(main), config(main, bf16)], zeroing=True)
                log_pool([config(main), config(main, bf16)], zeroing=True,
                         predicted="one precision: main cache fp8_e4m3, index cache fp8")
                """
            ),
        ],
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    log = proc.stdout + proc.stderr
    assert "vllm-minimax-m3-kv active: minimax_m3_config_hook" in log
    # What the README and docs/ tell an operator to grep for, verbatim.
    from tests.test_docs import doc_log_lines

    for line in doc_log_lines():
        assert line in log, line
    assert (
        "MiniMax-M3 KV pool: one precision (uint8/FP8_PER_TENSOR) on all 8 workers; "
        "no KV block zeroer is built." in log
    )
    assert (
        "MiniMax-M3 KV pool: mixed precision (bfloat16/NONE, uint8/FP8_PER_TENSOR); "
        "every one of 2 workers and the scheduler zero newly allocated blocks." in log
    )


def test_aiter_msa_probe_is_cached_per_process(tmp_path):
    # Asked once per engine config; cached per process, as vLLM finds aiter
    # once (the simulation's switch clears it itself).
    import importlib
    import sys

    from vllm_minimax_m3_kv.config.facts import AITER_MSA_MODULES, aiter_has_msa_kernels

    ops = tmp_path / "aiter" / "ops"
    ops.mkdir(parents=True)
    (tmp_path / "aiter" / "__init__.py").write_text("")
    sys.path.insert(0, str(tmp_path))
    try:
        importlib.invalidate_caches()
        assert aiter_has_msa_kernels() is False
        for name in AITER_MSA_MODULES:
            (ops / f"{name}.py").write_text("")
        importlib.invalidate_caches()
        assert aiter_has_msa_kernels() is False  # cached
        aiter_has_msa_kernels.cache_clear()
        assert aiter_has_msa_kernels() is True
    finally:
        sys.path.remove(str(tmp_path))
        importlib.invalidate_caches()


def test_the_active_line_reaches_the_api_servers_log():
    # vllm serve's API server loads plugins while parsing its flags (logging
    # not configured yet, so INFO lines are dropped), then configures logging
    # in create_engine_config; the line must appear there, once.
    proc = fork_python(
        [
            "-c",
            textwrap.dedent(
                """
                from vllm_minimax_m3_kv_sim.hardware import simulate
                simulate("mi355x")
                import vllm.plugins
                vllm.plugins.load_general_plugins()  # as add_cli_args does
                from vllm_minimax_m3_kv_sim import engine as sim
                for _ in range(2):
                    sim.make_engine_args({"max_model_len": 8192}).create_engine_config()
                """
            ),
        ],
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    log = proc.stdout + proc.stderr
    assert log.count("vllm-minimax-m3-kv active: minimax_m3_config_hook") == 1, log[
        -3000:
    ]


_SITES_FROM_COPIES = """
import json, logging, pathlib, sys
sys.path.insert(0, {repo!r})
from vllm_minimax_m3_kv import _versions, patch_sites

# The installed vLLM with some modules' source edited: detection reads the
# copies, the modules vLLM imports stay the real ones.
edits = {edits!r}
copies = {{}}
for module, (old, new) in edits.items():
    text = _versions.vllm_source_file(module).read_text()
    assert old in text, (module, old)
    path = pathlib.Path({tmp!r}, module + ".py")
    path.write_text(text.replace(old, new))
    copies[module] = path
real = _versions.vllm_source_file
patch_sites.vllm_source_file = lambda module: copies.get(module) or real(module)

records = []
class Keep(logging.Handler):
    def emit(self, record):
        records.append(record)
logging.getLogger("vllm.vllm_minimax_m3_kv").addHandler(Keep())
import vllm_minimax_m3_kv
vllm_minimax_m3_kv.register()
built = None
if {build!r}:
    # vLLM's own build and planner on a simulated B300, as check's stock
    # child runs them, with whatever entries applied.
    from vllm_minimax_m3_kv.entrypoints.check.stock_child import _build
    built = _build({build!r}, "b300")
import vllm.model_executor.models.config as c
from vllm.v1.kv_cache_interface import KVCacheConfig
from vllm.v1.core import kv_cache_planning
print(json.dumps({{
    "applied": list(vllm_minimax_m3_kv._applied),
    "warnings": [r.getMessage() for r in records if r.levelno == logging.WARNING],
    "config_hooked": any(hasattr(h, "stock_hook") for h in c.MODELS_CONFIG_MAP.values()),
    "zeroing_wrapped": hasattr(KVCacheConfig.needs_kv_cache_zeroing.fget, "__wrapped__"),
    "planner_wrapped": hasattr(kv_cache_planning.get_kv_cache_configs, "__wrapped__"),
    "built": built,
}}))
"""


def test_a_reworded_vllm_message_changes_nothing(tmp_path):
    """Detection reads code, not wording: the two vLLM messages the ROCm entry
    answers, reworded by a patch release, leave every entry on."""
    edits = {
        "vllm.models.minimax_m3.common.indexer": (
            "requires CUDA fp8 support.", "needs a CUDA GPU with fp8."
        ),
        "vllm.models.minimax_m3.amd.mtp": ("has nowhere to go", "cannot be placed"),
    }  # fmt: skip
    code = _SITES_FROM_COPIES.format(
        repo=str(REPO), edits=edits, tmp=str(tmp_path), build=None
    )
    result = json_from_stdout(["-c", code], None, timeout=300)
    from vllm_minimax_m3_kv import patches

    assert result["applied"] == [p.name for p in patches.PATCHES]
    assert result["warnings"] == []


def test_a_missing_site_leaves_out_its_entry_and_what_needs_it_not_the_zeroing():
    """vLLM's config-hook table renamed: the config hook stays out, with the
    ROCm entries that need it, named in one warning; the index-cache storage,
    the engine-wide zeroing decision and the env table still apply, so a
    mixed pool stock vLLM builds is still zeroed (docs/design.md)."""
    import tempfile

    edits = {
        "vllm.model_executor.models.config": ("MODELS_CONFIG_MAP", "MODEL_HOOKS"),
    }
    # The B300 recipe's pool without an explicit indexer dtype: stock vLLM
    # 0.33 keeps the index cache bf16 beside the fp8 KV cache.
    argv = ["--kv-cache-dtype", "fp8", "--tensor-parallel-size", "8",
            "--max-model-len", "8192"]  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        code = _SITES_FROM_COPIES.format(
            repo=str(REPO), edits=edits, tmp=tmp, build=argv
        )
        result = json_from_stdout(["-c", code], None, timeout=600)
    assert result["applied"] == [
        "minimax_m3_indexer_cache_storage",
        "minimax_m3_kv_zeroing_decision",
        "minimax_m3_kv_allow_mixed_env",
    ]
    assert result["zeroing_wrapped"] and result["planner_wrapped"]
    assert not result["config_hooked"]
    # Mixed, as stock builds it, and zeroed: every worker and the scheduler
    # (stock 0.33's scheduler would not ask: tests/reliability/zeroing.py).
    built = result["built"]
    assert built["indexer_kv_dtype"] == "bf16" and len(built["kinds"]) == 2, built
    assert all(built["workers_zero"]) and built["scheduler_zeroes"], built
    (warning,) = result["warnings"]
    assert warning.startswith(
        "vllm-minimax-m3-kv: minimax_m3_config_hook not recognised: "
        "vllm.model_executor.models.config lacks MODELS_CONFIG_MAP; "
        "minimax_m3_rocm_fp8_triton_indexer requires minimax_m3_config_hook; "
        "minimax_m3_rocm_fnuz_index_writer requires "
        "minimax_m3_rocm_fp8_triton_indexer; minimax_m3_rocm_fp8_balanced_decode "
        "requires minimax_m3_rocm_fp8_triton_indexer. Those entries stay out and "
        "vLLM runs them unchanged; the rest apply."
    )


_CONCURRENT_DRAFTER_BUILDS = """
import json, sys, threading
sys.path.insert(0, {repo!r})
from vllm_minimax_m3_kv.entrypoints.check.target_platform import simulate

simulate("mi355x", "msa")
from vllm.config import AttentionConfig, VllmConfig, set_current_vllm_config

from vllm_minimax_m3_kv.model_executor.models.minimax_m3_rocm_fp8_triton_indexer import (
    wrap_mtp_init,
    wrap_resolve_indexer_kv_dtype,
)

# As the entry installs them when vLLM imports its ROCm MTP module.
AttentionConfig.resolve_indexer_kv_dtype = wrap_resolve_indexer_kv_dtype(
    AttentionConfig.resolve_indexer_kv_dtype
)
installed = AttentionConfig.resolve_indexer_kv_dtype
barrier = threading.Barrier(3, timeout=60)
seen = {{}}


def layer(vllm_config):
    return vllm_config.attention_config.resolve_indexer_kv_dtype("bf16")


def drafter_init(self, *, vllm_config, prefix=""):
    # vLLM's shape: the inline bf16-only check, then layers that ask too.
    check = vllm_config.attention_config.resolve_indexer_kv_dtype("bf16")
    barrier.wait()  # both builds inside, and an unrelated thread asking
    barrier.wait()
    seen[prefix] = [check, layer(vllm_config)]


init = wrap_mtp_init(drafter_init)
config = VllmConfig(attention_config=AttentionConfig(indexer_kv_dtype="fp8"))


def build(prefix):
    with set_current_vllm_config(config):
        init(object(), vllm_config=config, prefix=prefix)


def other():
    barrier.wait()
    seen["other thread"] = config.attention_config.resolve_indexer_kv_dtype("bf16")
    barrier.wait()


threads = [threading.Thread(target=build, args=(p,)) for p in ("a", "b")]
threads.append(threading.Thread(target=other))
for t in threads:
    t.start()
for t in threads:
    t.join()
print(json.dumps({{
    "seen": seen,
    "class_unchanged": AttentionConfig.resolve_indexer_kv_dtype is installed,
}}))
"""


def test_concurrent_drafter_builds_each_hear_bf16_and_nothing_else_does(tmp_path):
    """The ROCm MTP drafter's inline bf16-only check hears "bf16" on the fp8
    Triton path, its layers and every other thread hear fp8, and nothing on
    vLLM's config class is swapped while builds overlap (simulated MI355X)."""
    script = tmp_path / "concurrent_drafters.py"
    script.write_text(_CONCURRENT_DRAFTER_BUILDS.format(repo=str(REPO)))
    proc = fork_python([str(script)], None, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result == {
        "seen": {"a": ["bf16", "fp8"], "b": ["bf16", "fp8"], "other thread": "fp8"},
        "class_unchanged": True,
    }
