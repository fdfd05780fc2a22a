"""vLLM plugin: MiniMax-M3's indexer cache inherits fp8 from an fp8 KV cache.

``register`` is the ``vllm.general_plugins`` entry point. vLLM calls it once in
every process (front end, engine core, workers); it is idempotent, imports no
model or kernel code and never touches the GPU. What it changes is listed in
:mod:`vllm_minimax_m3_kv.patches`.
"""

from __future__ import annotations

__all__ = ["register"]

_registered: bool | None = None
_applied: tuple[str, ...] = ()
"""The registry entries this process applied (``patches.PATCHES`` names)."""


def register() -> None:
    """Apply every patch in the registry, or none if vLLM is unfamiliar."""
    global _registered, _applied
    if _registered is not None:
        return
    from vllm_minimax_m3_kv import patches
    from vllm_minimax_m3_kv._log import get_logger, info_when_vllm_logs
    from vllm_minimax_m3_kv._versions import SUPPORTED_VLLM_INSTALL

    logger = get_logger(__name__)
    problems = patches.unsupported_reasons()
    if problems:
        _registered = False
        logger.warning(
            "vllm-minimax-m3-kv is inactive, vLLM runs unchanged: %s. %s; or "
            "pip uninstall vllm-minimax-m3-kv.",
            "; ".join(problems),
            SUPPORTED_VLLM_INSTALL,
        )
        return
    applied, left_to_vllm = [], []
    for patch in patches.PATCHES:
        if (native := patch.superseded()) is not None:
            left_to_vllm.append(f"{patch.name} ({native})")
            continue
        patch.apply()
        applied.append(patch.name)
    _applied = tuple(applied)
    _registered = True
    lines = [f"vllm-minimax-m3-kv active: {', '.join(applied)}"]
    if left_to_vllm:
        lines.append(
            f"vllm-minimax-m3-kv: this vLLM already does {'; '.join(left_to_vllm)}; "
            "those entries stay out, and VLLM_MINIMAX_M3_KV_ALLOW_MIXED cannot "
            "reopen what vLLM refuses."
        )
    # INFO, so an operator can grep a server log for it (once per process);
    # held until vLLM's logging is configured, which the config hook sees.
    info_when_vllm_logs(__name__, lines)
