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

This module reads the checkpoint where vLLM reads it and answers one
question, :func:`auto_kv_cache`: what ``--kv-cache-dtype auto`` gives on this
model. It imports vLLM only for vLLM's own modelopt mapping.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from vllm.config import ModelConfig

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

    field: str = dataclasses.field(init=False, compare=False)
    """Which checkpoint field declares it, e.g. ``compressed-tensors
    kv_cache_scheme``."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "field", f"{self.method} {self.key}")


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


def applied_kv_cache(
    declared: CheckpointKVCache | None, builds_generic_attention: bool
) -> CheckpointKVCache | None:
    """The declaration vLLM gives ``--kv-cache-dtype auto``, if it applies.

    ``builds_generic_attention``: the model has a layer vLLM builds with its
    generic ``Attention`` (a MiniMax-M3 dense layer), the only place vLLM
    applies a compressed-tensors ``kv_cache_scheme``. Without one, vLLM
    ignores the scheme and ``auto`` stays the model dtype.
    """
    if declared is None:
        return None
    if declared.applied_at_model_build and not builds_generic_attention:
        return None
    return declared


def checkpoint_quant_config(model_config: ModelConfig) -> Mapping[str, Any] | None:
    """The checkpoint's quantization config, where ``get_quant_config``
    (``model_executor/model_loader/weight_utils.py``) reads it: the HF
    config, else its text config, else compressed-tensors'
    ``compression_config``."""
    hf_config = model_config.hf_config
    quant = getattr(hf_config, "quantization_config", None)
    text_config = getattr(hf_config, "text_config", None)
    if quant is None and text_config is not None:
        quant = getattr(text_config, "quantization_config", None)
    if quant is None:
        quant = getattr(hf_config, "compression_config", None)
    if quant is not None and not isinstance(quant, Mapping):
        quant = quant.to_dict() if hasattr(quant, "to_dict") else None
    return quant


def checkpoint_kv_cache(model_config: ModelConfig) -> CheckpointKVCache | None:
    """The KV cache dtype the checkpoint declares, by vLLM's own rules."""
    quant = checkpoint_quant_config(model_config)
    if not quant:
        return None
    found = compressed_tensors_kv_cache(quant, model_config.quantization)
    if found is not None:
        return found
    # vLLM's own modelopt mapping, as resolve_kv_cache_dtype_string (called by
    # EngineArgs.create_engine_config) applies it to hf_config's config.
    hf_quant = getattr(model_config.hf_config, "quantization_config", None)
    if not str((hf_quant or {}).get("quant_method", "")).startswith("modelopt"):
        return None
    from vllm.utils.torch_utils import resolve_kv_cache_dtype_string

    return modelopt_kv_cache(
        hf_quant, resolve_kv_cache_dtype_string("auto", model_config)
    )


def auto_kv_cache(
    model_config: ModelConfig, builds_generic_attention: bool
) -> CheckpointKVCache | None:
    """What ``--kv-cache-dtype auto`` stores on this model: the checkpoint's
    declaration where vLLM applies it, else None (the model dtype)."""
    return applied_kv_cache(checkpoint_kv_cache(model_config), builds_generic_attention)
