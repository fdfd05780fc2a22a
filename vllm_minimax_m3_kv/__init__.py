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
    """Apply every registry entry this vLLM's sites allow (none outside the
    supported range), once per process."""
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
    decided = patches.activation()
    for patch in decided.apply:
        patch.apply()
    _applied = tuple(patch.name for patch in decided.apply)
    _registered = True
    if decided.left_out:
        # A partly recognised vLLM (a patch release that moved one site): say
        # which site, and what stays out with it; the rest still applies.
        logger.warning(
            "vllm-minimax-m3-kv: %s. Those entries stay out and vLLM runs them "
            "unchanged; the rest apply. %s",
            "; ".join(f"{name} {why}" for name, why in decided.left_out),
            SUPPORTED_VLLM_INSTALL,
        )
    lines = [f"vllm-minimax-m3-kv active: {', '.join(_applied) or 'nothing'}"]
    if decided.native:
        lines.append(
            "vllm-minimax-m3-kv: this vLLM already does "
            + "; ".join(f"{name} ({found})" for name, found in decided.native)
            + "; those entries stay out, and VLLM_MINIMAX_M3_KV_ALLOW_MIXED cannot "
            "reopen what vLLM refuses."
        )
    # INFO, so an operator can grep a server log for it (once per process);
    # held until vLLM's logging is configured, which the config hook sees.
    info_when_vllm_logs(__name__, lines)
