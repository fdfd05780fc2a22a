"""vLLM plugin: MiniMax-M3's indexer cache inherits fp8 from an fp8 KV cache.

``register`` is the ``vllm.general_plugins`` entry point. vLLM calls it once in
every process (front end, engine core, workers); it is idempotent, imports no
model or kernel code and never touches the GPU. What it changes is listed in
:mod:`vllm_minimax_m3_kv.patches`.
"""

from __future__ import annotations

__all__ = ["register"]

_registered: bool | None = None


def register() -> None:
    """Apply every patch in the registry, or none if vLLM is unfamiliar."""
    global _registered
    if _registered is not None:
        return
    from vllm_minimax_m3_kv import patches
    from vllm_minimax_m3_kv._log import get_logger

    logger = get_logger(__name__)
    problems = patches.unsupported_reasons()
    if problems:
        _registered = False
        logger.warning(
            "vllm-minimax-m3-kv is inactive, vLLM runs unchanged: %s. "
            "Install a supported vLLM (pip install 'vllm>=0.33,<0.34') or "
            "uninstall vllm-minimax-m3-kv.",
            "; ".join(problems),
        )
        return
    for patch in patches.PATCHES:
        patch.apply()
    _registered = True
    # INFO, so an operator can grep a server log for it (one line per process).
    logger.info(
        "vllm-minimax-m3-kv active: %s", ", ".join(p.name for p in patches.PATCHES)
    )
