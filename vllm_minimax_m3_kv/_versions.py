"""Which vLLM this plugin supports, read without importing vLLM."""

from __future__ import annotations

from importlib import metadata

SUPPORTED_VLLM = ((0, 33), (0, 34))
"""Half-open ``[0.33, 0.34)`` range, as in ``pyproject.toml``."""
SUPPORTED_VLLM_RANGE = ">=0.33,<0.34"
SUPPORTED_VLLM_INSTALL = (
    f"vllm-minimax-m3-kv needs vLLM {SUPPORTED_VLLM_RANGE}: on ROCm use a vLLM "
    "0.33 image and install the plugin beside it with pip install --no-deps "
    f"vllm-minimax-m3-kv; elsewhere pip install 'vllm{SUPPORTED_VLLM_RANGE}' "
    "(a CUDA wheel, which would replace a ROCm build)"
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
