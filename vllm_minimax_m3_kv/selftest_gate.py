"""When and where the node self-test runs, and what its verdict does.

vLLM's ``select_indexer_impl_cls`` asks :func:`check_node_once` before the
plugin selects its Triton indexer for an fp8 index cache on ROCm. That call
comes from inside vLLM's model build, in every worker, under a GPU default
device and the model's default dtype (``model_loader/base_loader.py``), so:

* the self-test runs in a context of its own (``selftest.isolated_from_caller``:
  default device and dtype reset, every tensor placed and typed, the
  autotuner's choices on the toy problem put back);
* anything it raises becomes the plugin's refusal with its fixes, never a
  bare traceback from a worker;
* a passed verdict is kept per node, keyed by what ran (host, GPU
  architecture, runtime and driver, torch, Triton, vLLM and plugin versions,
  fp8 type, the scorers' module, every plugin switch that changes which
  kernel serves, and a content hash of the plugin's modules and the vLLM
  sources the self-test runs), under vLLM's cache root: later starts read it
  instead of running the kernels again. A file is used only if it parses as a
  passed verdict of this schema for this exact key; anything else is ignored
  with one warning naming it, and the self-test runs. A failed verdict is
  never kept.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import threading
from pathlib import Path
from typing import Any

from vllm_minimax_m3_kv._versions import installed_version, plugin_version
from vllm_minimax_m3_kv.envs import (
    SKIP_SELFTEST_ENV,
    fp8_balanced_decode_from_env,
    skip_selftest_from_env,
)
from vllm_minimax_m3_kv.selftest import (
    Case,
    Fp8Format,
    Result,
    SelftestFailed,
    device_name,
    e4m3,
    isolated_from_caller,
    kernel_device,
    make_inputs,
    platform_fp8,
    run_scorers,
    scorer_module,
    verdict_line,
)
from vllm_minimax_m3_kv.selftest_judge import judge, references
from vllm_minimax_m3_kv.selftest_writer import check_writer

FAILURE_FIXES = (
    f"{SKIP_SELFTEST_ENV}=1  # serve anyway (only on an image verified before)",
    "--kv-cache-dtype auto  # main cache bf16, no fp8 index cache",
)
VERDICT_DIR = "vllm_minimax_m3_kv"
"""Under vLLM's cache root (``VLLM_CACHE_ROOT``)."""
VERDICT_SCHEMA = 2
"""Schema 1 had no schema field, verdict, or code hash: never read."""


def run_selftest(
    case: Case | None = None, device: str | None = None, fmt: Fp8Format | None = None
) -> Result:
    """Run the scorers on this device on fp8 bytes and judge them against
    fp64 (the writer half: :mod:`.selftest_writer`)."""
    import torch

    case = case or Case()
    device = device or kernel_device()
    fmt = fmt or platform_fp8()
    with isolated_from_caller(scorer_module()):
        inputs = make_inputs(case)
        stored = {name: e4m3(value, fmt) for name, value in inputs.items()}
        outputs = run_scorers(case, *stored.values(), device=device)
        result = judge(case, outputs, references(case, stored))
        result.record |= {
            "case": case.to_record(),
            "fp8": fmt.dtype,
            "device": device_name(device),
            "versions": _versions(),
            "bytes": {name: value.view(torch.uint8) for name, value in stored.items()},
            "outputs": outputs,
        }
    return result


def _versions() -> dict[str, str]:
    """Where a record was made, beside its device name."""
    import torch
    import triton

    from vllm_minimax_m3_kv._versions import installed_version, plugin_version

    return {
        "torch": str(torch.__version__),
        "triton": str(triton.__version__),
        "vllm": installed_version("vllm") or "none",
        "plugin": plugin_version(),
        "interpreter": os.environ.get("TRITON_INTERPRET", ""),
    }


def run_node_selftest() -> Result:
    """Both halves on this process's GPU (not run without one)."""
    device = kernel_device()
    if device == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
        return Result(failures=["not run: no GPU in this process"], ran=False)
    fmt = platform_fp8()
    result = run_selftest(device=device, fmt=fmt)
    result.writer = check_writer(result, device, fmt)
    return result


def node_key(device: str) -> dict[str, str]:
    """What the verdict depends on."""
    import torch
    import triton

    runtime = f"hip {torch.version.hip}" if torch.version.hip else None
    return {
        "host": socket.gethostname(),
        "gpu": device_name(device),
        "arch": _gpu_arch(device),
        "runtime": runtime or f"cuda {torch.version.cuda}",
        "driver": _driver_version(),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "vllm": installed_version("vllm") or "none",
        "plugin": plugin_version(),
        "fp8": platform_fp8().dtype,
        "scorers": scorer_module().__name__,
        # Opt-ins that change which kernel serves (vLLM's balanced decode
        # scorer on fp8): a verdict made without one never vouches for it.
        "fp8_balanced_decode": str(fp8_balanced_decode_from_env()),
        "code": code_hash(),
    }


def code_hash() -> str:
    """sha256 over the plugin's modules and the vLLM sources the self-test
    runs (the indexer module and its scorers), so an edited checkout
    reinstalled at the same version is a new key."""
    from vllm.models.minimax_m3.common import indexer as vllm_indexer

    digest = hashlib.sha256()
    package = Path(__file__).parent
    sources = sorted(package.rglob("*.py"))
    sources += [Path(vllm_indexer.__file__), Path(scorer_module().__file__)]
    for path in sources:
        digest.update(path.name.encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


def _gpu_arch(device: str) -> str:
    import torch

    if device != "cuda":
        return "cpu"
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    return getattr(props, "gcnArchName", None) or f"sm{props.major}{props.minor}"


def _driver_version() -> str:
    for path in ("/sys/module/amdgpu/version", "/proc/driver/nvidia/version"):
        try:
            return Path(path).read_text(encoding="utf-8").splitlines()[0].strip()
        except (OSError, IndexError):
            continue
    return "unknown"


def cache_root() -> str:
    """vLLM's cache root, as vLLM reads it, where an empty
    ``VLLM_CACHE_ROOT`` means vLLM's default (never the working directory)."""
    import vllm.envs as vllm_envs

    if os.environ.get("VLLM_CACHE_ROOT", None) == "":
        return os.path.join(vllm_envs.get_default_cache_root(), "vllm")
    return vllm_envs.VLLM_CACHE_ROOT


def verdict_path(key: dict[str, str]) -> Path:
    """Where a passed verdict for ``key`` is kept."""
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()
    return Path(cache_root(), VERDICT_DIR, f"selftest-{digest[:16]}.json")


def cached_result(path: Path, key: dict[str, str]) -> Result | None:
    """The passed verdict kept at ``path`` for ``key``, or None: no file, or
    one that is not a passed verdict of this schema for this exact key (one
    warning names it; the self-test then runs)."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except OSError as error:
        return _ignored(path, f"cannot be read ({error})")
    try:
        stored = json.loads(text)
    except ValueError:
        return _ignored(path, "is not JSON")
    why = _not_a_pass(stored, key)
    if why:
        return _ignored(path, why)
    return Result(
        checked=stored["checked"],
        record={
            "device": key["gpu"],
            "fp8": key["fp8"],
            "cached": str(path),
            "score_error": stored["score_error"],
        },
        writer=stored["writer"],
    )


def _not_a_pass(stored: object, key: dict[str, str]) -> str | None:
    """Why ``stored`` is not a passed verdict this code wrote for ``key``."""
    if not isinstance(stored, dict):
        return f"holds a JSON {type(stored).__name__}, not a verdict"
    if stored.get("schema") != VERDICT_SCHEMA:
        return f"has schema {stored.get('schema')!r}, not {VERDICT_SCHEMA}"
    if stored.get("verdict") != "passed":
        return f"says verdict {stored.get('verdict')!r}, not 'passed'"
    if stored.get("key") != key:
        return "was kept for another node, code or setting"
    checked, error = stored.get("checked"), stored.get("score_error")
    if type(checked) is not int or checked <= 0:
        return f"has checks {checked!r}"
    if type(error) is not float or not 0.0 <= error <= 1.0:
        return f"has score error {error!r}, not within its bound"
    if not isinstance(stored.get("writer"), str):
        return "names no writer verdict"
    return None


def _ignored(path: Path, why: str) -> None:
    from vllm_minimax_m3_kv._log import get_logger

    get_logger(__name__).warning(
        "MiniMax-M3 fp8 indexer self-test: ignoring %s: it %s; running the "
        "self-test instead.",
        path,
        why,
    )
    return None


def store_result(path: Path, key: dict[str, str], result: Result) -> None:
    """Write a passed verdict, atomically: every worker of a node may write."""
    entry = {
        "schema": VERDICT_SCHEMA,
        "verdict": "passed",
        "key": key,
        "checked": result.checked,
        "writer": result.writer,
        "score_error": float(result.record["score_error"]),
    }
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(f".{os.getpid()}.tmp")
        partial.write_text(json.dumps(entry, indent=1), encoding="utf-8")
        os.replace(partial, path)
    except OSError:
        pass  # a read-only cache root only costs the next start a rerun


def node_verdict(use_kept: bool = True) -> Result:
    """The verdict for this process: the one kept for this node (unless
    ``use_kept`` is False), or a run now, kept if it passes. What the
    self-test raises is a failed verdict, not an exception."""
    device = kernel_device()
    path = key = None
    try:
        if device != "cpu" or os.environ.get("TRITON_INTERPRET") == "1":
            key = node_key(device)
            path = verdict_path(key)
            cached = cached_result(path, key) if use_kept else None
            if cached is not None:
                return cached
        result = run_node_selftest()
    except Exception as error:
        return Result(
            failures=[f"the self-test raised {type(error).__name__}: {error}"],
            record={"device": device},
        )
    if result.passed and path is not None and key is not None:
        store_result(path, key, result)
    return result


_checked = threading.Lock()
_node_result: list[Result] = []


def check_node_once() -> None:
    """Run the self-test once per process before the fp8 Triton indexer is
    selected; stop the start with its fixes if it fails."""
    from vllm_minimax_m3_kv._log import get_logger

    logger = get_logger(__name__)
    if skip_selftest_from_env():
        logger.info_once(
            "MiniMax-M3 fp8 indexer self-test skipped (%s).", SKIP_SELFTEST_ENV
        )
        return
    with _checked:
        if not _node_result:
            _node_result.append(node_verdict())
    result = _node_result[0]
    if result.passed:
        cached = result.record.get("cached")
        logger.info_once(
            "MiniMax-M3 fp8 indexer %s%s",
            verdict_line(result),
            f" (cached verdict: {cached}; delete it to run again)" if cached else "",
        )
        return
    if not result.ran:  # no device in this process (a CPU build, a test)
        logger.warning_once("MiniMax-M3 fp8 indexer self-test %s", result.failures[0])
        return
    raise SelftestFailed(
        f"MiniMax-M3 fp8 index cache on vLLM's Triton indexer: {verdict_line(result)}. "
        "This GPU does not reproduce the fp8 index cache; do not serve an fp8 "
        "index cache here.\nFix with one of:\n  " + "\n  ".join(FAILURE_FIXES)
    )


def selftest_state() -> dict[str, Any]:
    """What this process's gate decided (for tests and ``status``)."""
    if not _node_result:
        return {"ran": False}
    result = _node_result[0]
    return {
        "ran": result.ran,
        "passed": result.passed,
        "cached": result.record.get("cached"),
        "line": verdict_line(result),
    }
