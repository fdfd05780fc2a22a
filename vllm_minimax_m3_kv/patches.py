"""Every change this plugin makes to vLLM, on one screen.

Each entry says why, how, which upstream PR it mirrors or awaits, and when to
delete it. ``detect`` runs at plugin load without importing model or kernel
code; only when every entry recognises the installed vLLM is anything applied,
so an unfamiliar vLLM gets one warning and stock behaviour, never half a patch.
``tests/test_plugin_load.py`` covers each entry, and the end-to-end tests
in ``tests/models/`` fail if either one stops working.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from types import ModuleType

from vllm_minimax_m3_kv._import_hooks import when_imported

SUPPORTED_VLLM = ((0, 33), (0, 34))
"""Half-open ``[0.33, 0.34)`` range, as in ``pyproject.toml``."""

INDEXER_MODULE = "vllm.models.minimax_m3.common.indexer"
MODELS_CONFIG_MODULE = "vllm.model_executor.models.config"


@dataclass(frozen=True)
class Patch:
    name: str
    why: str
    how: str
    upstream: str
    remove_when: str
    detect: Callable[[], str | None]
    """None when the installed vLLM has what ``apply`` changes, else why not."""
    apply: Callable[[], None]


def _vllm_file(module: str) -> Path | None:
    """Where a vLLM module's source lives, found without importing it."""
    # find_spec of the top-level package locates it without importing it.
    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        return None
    root = Path(next(iter(spec.submodule_search_locations)))
    path = root.joinpath(*module.split(".")[1:]).with_suffix(".py")
    return path if path.is_file() else None


def _source_lacks(module: str, *needles: str) -> str | None:
    path = _vllm_file(module)
    if path is None:
        return f"{module} is missing"
    text = path.read_text(encoding="utf-8")
    missing = [needle for needle in needles if needle not in text]
    return f"{module} lacks {', '.join(missing)}" if missing else None


# -- MiniMax-M3 config hook ---------------------------------------------------


def _detect_config_hook() -> str | None:
    return _source_lacks(
        MODELS_CONFIG_MODULE, "MODELS_CONFIG_MAP", "class VerifyAndUpdateConfig"
    ) or _source_lacks(
        "vllm.config.attention", "indexer_kv_dtype", "minimax_m3_indexer_cp"
    )


def _patch_config_map(module: ModuleType) -> None:
    from vllm_minimax_m3_kv.config.facts import MINIMAX_M3_ARCHITECTURES
    from vllm_minimax_m3_kv.model_executor.models.config import make_config_hook

    registry = module.MODELS_CONFIG_MAP
    for arch in MINIMAX_M3_ARCHITECTURES:
        stock = registry.get(arch)
        # Our hook classes carry `stock_hook`; wrapping one again would stack.
        if not hasattr(stock, "stock_hook"):
            registry[arch] = make_config_hook(stock)


def _apply_config_hook() -> None:
    # VllmConfig imports this module when it first verifies a model config;
    # importing it here would pull in vLLM's model registry at plugin load.
    when_imported(MODELS_CONFIG_MODULE, _patch_config_map)


# -- MiniMax-M3 indexer cache storage description ------------------------------


def _detect_indexer_cache() -> str | None:
    return _source_lacks(
        INDEXER_MODULE,
        "class MiniMaxM3IndexerCache",
        "def get_kv_cache_spec",
        "def bind_kv_cache",
        "cache_dtype = torch.float8_e4m3fn",
    )


def _patch_indexer_cache(module: ModuleType) -> None:
    from vllm_minimax_m3_kv.model_executor.models.minimax_m3_indexer_cache import (
        wrap_bind_kv_cache,
        wrap_get_kv_cache_spec,
    )

    cache_cls = module.MiniMaxM3IndexerCache
    if hasattr(cache_cls.get_kv_cache_spec, "__wrapped__"):
        return
    cache_cls.get_kv_cache_spec = wrap_get_kv_cache_spec(cache_cls.get_kv_cache_spec)
    cache_cls.bind_kv_cache = wrap_bind_kv_cache(cache_cls.bind_kv_cache)


def _apply_indexer_cache() -> None:
    when_imported(INDEXER_MODULE, _patch_indexer_cache)


PATCHES: tuple[Patch, ...] = (
    Patch(
        name="minimax_m3_config_hook",
        why=(
            "vLLM 0.33 resolves indexer_kv_dtype='auto' to bf16 for MiniMax-M3 "
            "whatever --kv-cache-dtype says, so an fp8 KV cache gets a bf16 "
            "indexer cache, a mixed-precision pool and a zeroer whose decision "
            "the scheduler drops (and PP stages disagree, HTTP 500)."
        ),
        how=(
            "When vllm.model_executor.models.config is imported, wraps its "
            "MODELS_CONFIG_MAP entries for the MiniMax-M3 architectures "
            "(vLLM's own entry runs first) to resolve 'auto' to fp8 where an fp8 "
            "indexer runs and raise a ValueError for every remaining mismatch."
        ),
        upstream=(
            "Model-side alternative to vllm-project/vllm#64472 (scheduler keeps "
            "the zeroing decision, PP stages agree); builds on #54466 and #47287."
        ),
        remove_when=(
            "vLLM resolves MiniMax-M3's indexer dtype from --kv-cache-dtype and "
            "validates the pair at config time."
        ),
        detect=_detect_config_hook,
        apply=_apply_config_hook,
    ),
    Patch(
        name="minimax_m3_indexer_cache_storage",
        why=(
            "Even with both caches fp8 e4m3, vLLM 0.33 describes the main cache "
            "as (uint8, FP8_PER_TENSOR) and the indexer cache as "
            "(float8_e4m3fn, NONE), and KVCacheConfig.has_mixed_precision_kv_cache "
            "compares those pairs, so the pool still counts as mixed."
        ),
        how=(
            "When the indexer module is imported, MiniMaxM3IndexerCache."
            "get_kv_cache_spec reports the main cache's storage dtype and quant "
            "mode for fp8 e4m3, and bind_kv_cache views the tensor back as "
            "float8_e4m3fn. Same bytes, same page size, same kernel input."
        ),
        upstream=(
            "Awaits an upstream fix; #64472 instead keeps zeroing on for mixed "
            "pools rather than making this pool uniform."
        ),
        remove_when=(
            "vLLM describes fp8 e4m3 caches one way, or compares storage bytes "
            "rather than (dtype, quant mode) pairs."
        ),
        detect=_detect_indexer_cache,
        apply=_apply_indexer_cache,
    ),
)


def vllm_version_problem() -> str | None:
    """None when the installed vLLM is in the supported range, else why not."""
    try:
        version = metadata.version("vllm")
    except metadata.PackageNotFoundError:
        return "vLLM is not installed"
    try:
        major, minor = (int(part) for part in version.split(".")[:2])
    except ValueError:
        return f"vLLM {version} has an unrecognised version"
    low, high = SUPPORTED_VLLM
    if not low <= (major, minor) < high:
        return f"vLLM {version} is outside the supported range >=0.33,<0.34"
    return None


def unsupported_reasons() -> list[str]:
    """Why the patches cannot be applied here; empty when they all can."""
    problem = vllm_version_problem()
    if problem is not None:
        return [problem]
    return [f"{p.name}: {why}" for p in PATCHES if (why := p.detect()) is not None]
