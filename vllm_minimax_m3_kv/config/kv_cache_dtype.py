"""The main KV cache dtype vLLM 0.33 builds for MiniMax-M3, from every source.

``--kv-cache-dtype`` is one source; the checkpoint's quantization config is
the other, and vLLM applies it in two places:

- modelopt (``kv_cache_quant_algo`` / ``kv_cache_scheme``): at config time,
  ``resolve_kv_cache_dtype_string`` in ``EngineArgs.create_engine_config``
  turns ``auto`` into the declared dtype before any config hook runs, so
  ``cache_config.cache_dtype`` already holds it;
- compressed-tensors (``kv_cache_scheme``, llm-compressor's FP8 KV recipe):
  only at model build, in ``Attention.__init__``
  (``model_executor/layers/attention/attention.py``), which sets
  ``cache_config.cache_dtype = "fp8"`` when it was ``auto``. MiniMax-M3's
  dense layers construct that ``Attention``; its sparse layers and the MTP
  drafter read ``cache_config.cache_dtype`` in their own ``__init__``, so a
  sparse layer built before the first dense one, or on a pipeline stage with
  no dense layer, keeps the model dtype.

Nothing here imports vLLM: :mod:`vllm_minimax_m3_kv.config.facts` reads the
fields where vLLM reads them and calls vLLM's own modelopt mapping.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

COMPRESSED_TENSORS = "compressed-tensors"
# What Attention.__init__ writes for any compressed-tensors kv_cache_scheme.
COMPRESSED_TENSORS_KV_CACHE_DTYPE = "fp8"


@dataclass(frozen=True)
class CheckpointKVCache:
    """A KV cache dtype the checkpoint's quantization config declares."""

    dtype: str
    """The ``--kv-cache-dtype`` value vLLM gives ``auto`` for it."""
    method: str
    """The quantization method: ``compressed-tensors`` or ``modelopt``."""
    key: str
    """The field that declares it, e.g. ``kv_cache_scheme``."""
    applied_at_model_build: bool
    """vLLM applies it only while building layers (compressed-tensors)."""

    @property
    def field(self) -> str:
        """Which checkpoint field declares it, e.g. ``compressed-tensors
        kv_cache_scheme``."""
        return f"{self.method} {self.key}"


def compressed_tensors_kv_cache(
    quant_config: Mapping[str, Any] | None, quantization: str | None
) -> CheckpointKVCache | None:
    """The KV cache a compressed-tensors checkpoint declares, as
    ``Attention.__init__`` applies it: any ``kv_cache_scheme`` makes ``auto``
    fp8 (its bits and type are validated later, by the layer's quant method)."""
    if quantization != COMPRESSED_TENSORS or not quant_config:
        return None
    if quant_config.get("kv_cache_scheme") is None:
        return None
    return CheckpointKVCache(
        COMPRESSED_TENSORS_KV_CACHE_DTYPE,
        COMPRESSED_TENSORS,
        "kv_cache_scheme",
        applied_at_model_build=True,
    )


def modelopt_kv_cache(
    quant_config: Mapping[str, Any] | None, resolved: str | None
) -> CheckpointKVCache | None:
    """The KV cache a modelopt checkpoint declares, given what vLLM's
    ``get_kv_cache_quant_algo_string`` made of it (None: nothing declared)."""
    if not quant_config or resolved in (None, "auto"):
        return None
    method = str(quant_config.get("quant_method", ""))
    inner = quant_config.get("quantization", quant_config)
    key = next(
        (
            name
            for name in ("kv_cache_scheme", "kv_cache_quant_algo")
            if inner.get(name) or quant_config.get(name)
        ),
        "kv_cache_quant_algo",
    )
    return CheckpointKVCache(str(resolved), method, key, applied_at_model_build=False)


@dataclass(frozen=True)
class MainKVCacheDtype:
    """What every main cache layer stores, and where that came from."""

    dtype: str
    """The effective value (``auto``: the model dtype)."""
    flag: str
    """``cache_config.cache_dtype`` as the config hooks see it."""
    auto: str = "auto"
    """What ``--kv-cache-dtype auto`` gives here (``auto``: the model dtype)."""
    checkpoint: CheckpointKVCache | None = None
    """What the checkpoint declares, whether or not it applies."""

    @property
    def from_checkpoint(self) -> bool:
        """The dtype is the checkpoint's: ``auto`` resolved to it (modelopt's
        is resolved before the hooks, so its flag already holds it)."""
        return (
            self.checkpoint is not None
            and self.auto != "auto"
            and self.auto == self.dtype
            and (self.flag == "auto" or not self.checkpoint.applied_at_model_build)
        )

    @property
    def resolved_at_model_build(self) -> bool:
        """vLLM itself would only reach this dtype while building layers."""
        return self.dtype != self.flag


def effective_main_kv_cache_dtype(
    flag: str,
    checkpoint: CheckpointKVCache | None,
    builds_generic_attention: bool,
) -> MainKVCacheDtype:
    """The main KV cache dtype the model will build.

    ``builds_generic_attention``: the target has a layer vLLM builds with its
    generic ``Attention`` (a MiniMax-M3 dense layer), the only place vLLM
    applies a compressed-tensors ``kv_cache_scheme``. Without one, vLLM
    ignores the scheme and ``auto`` stays the model dtype.
    """
    applies = checkpoint is not None and (
        builds_generic_attention or not checkpoint.applied_at_model_build
    )
    auto = checkpoint.dtype if applies and checkpoint is not None else "auto"
    return MainKVCacheDtype(auto if flag == "auto" else flag, flag, auto, checkpoint)
