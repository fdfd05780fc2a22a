"""The plugin's loggers, inside vLLM's logger tree."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from vllm.logger import _VllmLogger


def get_logger(name: str) -> _VllmLogger:
    # vLLM configures handlers, format and level for the "vllm" tree only;
    # a logger outside it would drop our info lines.
    from vllm.logger import init_logger

    return init_logger(f"vllm.{name}")
