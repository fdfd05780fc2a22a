"""The plugin's loggers, inside vLLM's logger tree."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from vllm.logger import _VllmLogger

_pending_info: list[tuple[str, str]] = []
"""(logger name, line) pairs logged before vLLM configured its logging."""


def get_logger(name: str) -> _VllmLogger:
    # vLLM configures handlers, format and level for the "vllm" tree only;
    # a logger outside it would drop our info lines.
    from vllm.logger import init_logger

    return init_logger(f"vllm.{name}")


def info_when_vllm_logs(name: str, lines: list[str]) -> None:
    """Log ``lines`` at INFO now, or once vLLM's logging is configured.

    ``vllm serve``'s API server loads plugins while it parses its flags,
    before vLLM configures logging (in ``create_engine_config``): an INFO line
    logged then would be dropped.
    """
    _pending_info.extend((name, line) for line in lines)
    log_pending_info()


def log_pending_info() -> None:
    """Log what :func:`info_when_vllm_logs` held back, if vLLM now logs."""
    if not _pending_info or not logging.getLogger("vllm").hasHandlers():
        return
    while _pending_info:
        name, line = _pending_info.pop(0)
        get_logger(name).info(line)
