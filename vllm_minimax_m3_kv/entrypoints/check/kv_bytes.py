"""KV bytes per token for MiniMax-M3, from vLLM's own spec arithmetic.

Per layer the main cache holds K and V for the rank's KV heads; each sparse
layer adds one index-key vector per token. The page sizes come from vLLM's
``FullAttentionSpec`` / ``MLAAttentionSpec``, the same classes the model's
layers return, so dtype sizes and padding match what the planner budgets.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from vllm_minimax_m3_kv.config.pool_facts import FP8_E4M3_DTYPES

if TYPE_CHECKING:
    from vllm.config import ModelConfig

_BLOCK = 128


@dataclass(frozen=True)
class KVBytes:
    main: int
    indexer: int

    @property
    def total(self) -> int:
        return self.main + self.indexer


def sparse_layer_count(model_config: ModelConfig) -> int:
    from vllm_minimax_m3_kv.config.facts import model_facts

    return len(model_facts(model_config).sparse)


def kv_bytes_per_token(
    model_config: ModelConfig,
    *,
    kv_cache_dtype: str,
    indexer_kv_dtype: str,
    tensor_parallel_size: int,
    unquantized_layers: int = 0,
) -> KVBytes:
    """Bytes one token occupies on one rank, across all layers.

    ``unquantized_layers`` dense layers keep the model dtype
    (``--kv-cache-dtype-skip-layers``).
    """
    import torch
    from vllm.utils.torch_utils import kv_cache_dtype_str_to_dtype
    from vllm.v1.kv_cache_interface import (
        FullAttentionSpec,
        MLAAttentionSpec,
        get_kv_quant_mode,
    )

    text = model_config.hf_text_config

    def main_spec(dtype: str) -> FullAttentionSpec:
        return FullAttentionSpec(
            block_size=_BLOCK,
            num_kv_heads=max(1, text.num_key_value_heads // tensor_parallel_size),
            head_size=text.head_dim,
            dtype=kv_cache_dtype_str_to_dtype(dtype, model_config),
            # Packed formats (nvfp4, int4, turboquant, ...) size pages by mode.
            kv_quant_mode=get_kv_quant_mode(dtype),
        )

    indexer_dtype = (
        torch.float8_e4m3fn if indexer_kv_dtype in FP8_E4M3_DTYPES else torch.bfloat16
    )
    indexer = MLAAttentionSpec(
        block_size=_BLOCK,
        num_kv_heads=1,
        head_size=int(text.sparse_attention_config["sparse_index_dim"]),
        dtype=indexer_dtype,
    )
    quantized = text.num_hidden_layers - unquantized_layers
    return KVBytes(
        main=main_spec(kv_cache_dtype).page_size_bytes // _BLOCK * quantized
        + main_spec("auto").page_size_bytes // _BLOCK * unquantized_layers,
        indexer=indexer.page_size_bytes // _BLOCK * sparse_layer_count(model_config),
    )
