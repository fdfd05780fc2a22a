"""Does stock vLLM 0.33 build a KV block zeroer for DeepSeek V3.2?

``python -m tests.upstream.deepseek_v32_zeroing`` prints one line per
``--kv-cache-dtype``: the indexer cache's spec from vLLM's own
``DeepseekV32IndexerCache`` (constructed as ``Indexer`` constructs it: uint8,
fp8 values plus fp32 scales per 128), the MLA main cache's (dtype, quant mode)
from the two functions ``MLAAttention.get_kv_cache_spec`` calls, and
``KVCacheConfig.needs_kv_cache_zeroing`` for a pool of the two. Evidence for
the upstream PR text (where "one precision" is decided), not a test.
"""

from __future__ import annotations

import os


def main() -> None:
    os.environ["VLLM_TARGET_DEVICE"] = "cpu"
    import torch
    from vllm.config import (
        CacheConfig,
        ModelConfig,
        VllmConfig,
        set_current_vllm_config,
    )
    from vllm.model_executor.models.deepseek_v2 import DeepseekV32IndexerCache
    from vllm.utils.torch_utils import kv_cache_dtype_str_to_dtype
    from vllm.v1.kv_cache_interface import (
        KVCacheConfig,
        KVCacheGroupSpec,
        MLAAttentionSpec,
        get_kv_quant_mode,
    )

    from vllm_minimax_m3_kv.entrypoints.check.early import bundled_model_path

    # Any bf16 checkpoint gives the model dtype "auto" resolves to.
    model_config = ModelConfig(bundled_model_path(), skip_tokenizer_init=True)
    head_dim, quant_block = 128, 128  # DeepSeek V3.2's index_head_dim, Indexer's
    for kv in ("auto", "fp8", "fp8_e4m3", "fp8_ds_mla"):
        config = VllmConfig(
            model_config=model_config, cache_config=CacheConfig(cache_dtype=kv)
        )
        with set_current_vllm_config(config):
            index = DeepseekV32IndexerCache(
                head_dim=head_dim + head_dim // quant_block * 4,
                dtype=torch.uint8,
                prefix=f"model.layers.0.self_attn.indexer.k_cache.{kv}",
                cache_config=config.cache_config,
            ).get_kv_cache_spec(config)
        main = MLAAttentionSpec(
            block_size=index.block_size,
            num_kv_heads=1,
            max_tp_shards=1,
            head_size=576,
            dtype=kv_cache_dtype_str_to_dtype(kv, model_config),
            cache_dtype_str=kv,
            kv_quant_mode=get_kv_quant_mode(kv),
            state_content_bytes={"fp8_ds_mla": 656}.get(kv),
        )
        pool = KVCacheConfig(
            num_blocks=1,
            kv_cache_tensors=[],
            kv_cache_groups=[
                KVCacheGroupSpec(["model.layers.0.self_attn.attn"], main),
                KVCacheGroupSpec(["model.layers.0.self_attn.indexer.k_cache"], index),
            ],
        )
        print(
            f"--kv-cache-dtype {kv}: main ({main.dtype}, {main.kv_quant_mode.name}), "
            f"indexer ({index.dtype}, {index.kv_quant_mode.name}): "
            f"needs_kv_cache_zeroing={pool.needs_kv_cache_zeroing}"
        )


if __name__ == "__main__":
    main()
