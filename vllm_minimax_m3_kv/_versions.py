"""Which vLLM this plugin supports, read without importing vLLM."""

from __future__ import annotations

from importlib import metadata

SUPPORTED_VLLM = ((0, 33), (0, 34))
"""Half-open ``[0.33, 0.34)`` range, as in ``pyproject.toml``."""
SUPPORTED_VLLM_RANGE = ">=0.33,<0.34"
PLUGIN_INSTALL = "pip install --no-deps /path/to/vllm-minimax-m3-kv"
"""The plugin beside an installed vLLM, from its checkout or a wheel built
from it (the package is not on the package index)."""
SUPPORTED_VLLM_INSTALL = (
    f"vllm-minimax-m3-kv needs vLLM {SUPPORTED_VLLM_RANGE}: "
    f"pip install 'vllm{SUPPORTED_VLLM_RANGE}' (the CUDA wheel); on ROCm, run in "
    "a ROCm vLLM 0.33 image and install this plugin into it from its checkout "
    f"or wheel: {PLUGIN_INSTALL}"
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
        return f"vLLM {version} is outside the supported range {SUPPORTED_VLLM_RANGE}"
    return None
