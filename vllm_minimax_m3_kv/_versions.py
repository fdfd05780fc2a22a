"""This plugin's names and version, and which vLLM it supports, read
without importing vLLM."""

from __future__ import annotations

import importlib.util
from importlib import metadata
from pathlib import Path

DISTRIBUTION = "vllm-minimax-m3-kv"
"""The distribution's name, which is also its console script's
(``[project.scripts]`` in pyproject.toml; the launch scripts' CHECK_BIN)."""
ENTRY_POINT_GROUP = "vllm.general_plugins"
PLUGIN_ENTRY_POINT = "minimax_m3_kv"
"""The name vLLM loads the plugin by, and ``VLLM_PLUGINS`` lists
(``[project.entry-points]`` in pyproject.toml)."""

SUPPORTED_VLLM = ((0, 33), (0, 34))
"""Half-open ``[0.33, 0.34)`` range, as in ``pyproject.toml``."""
SUPPORTED_VLLM_RANGE = ">=0.33,<0.34"
PLUGIN_INSTALL = f"pip install --no-deps /path/to/{DISTRIBUTION}"
"""The plugin beside an installed vLLM, from its checkout or a wheel built
from it (the package is not on the package index)."""
SUPPORTED_VLLM_INSTALL = (
    f"{DISTRIBUTION} needs vLLM {SUPPORTED_VLLM_RANGE}: "
    f"pip install 'vllm{SUPPORTED_VLLM_RANGE}' (the CUDA wheel); on ROCm, run in "
    "a ROCm vLLM 0.33 image and install this plugin into it from its checkout "
    f"or wheel: {PLUGIN_INSTALL}"
)


def installed_version(package: str) -> str | None:
    """An installed distribution's version, from its metadata (not imported)."""
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def vllm_source_root() -> Path | None:
    """The installed ``vllm`` package directory, found without importing it
    (``find_spec`` of a top-level package does not import it)."""
    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def vllm_source_file(module: str) -> Path | None:
    """Where a vLLM module's source lives (``vllm.config.cache``), unimported."""
    root = vllm_source_root()
    if root is None:
        return None
    path = root.joinpath(*module.split(".")[1:]).with_suffix(".py")
    return path if path.is_file() else None


def plugin_version() -> str:
    """This plugin's version, or what runs it from an uninstalled checkout."""
    return installed_version(DISTRIBUTION) or "(uninstalled checkout)"


def vllm_version_problem() -> str | None:
    """None when the installed vLLM is in the supported range, else why not."""
    version = installed_version("vllm")
    if version is None:
        return "vLLM is not installed"
    try:
        major, minor = (int(part) for part in version.split(".")[:2])
    except ValueError:
        return f"vLLM {version} has an unrecognised version"
    low, high = SUPPORTED_VLLM
    if not low <= (major, minor) < high:
        return f"vLLM {version} is outside the supported range {SUPPORTED_VLLM_RANGE}"
    return None
