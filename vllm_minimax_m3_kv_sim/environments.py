"""The environments the tests and benchmarks judge under, defined once."""

from __future__ import annotations

from vllm_minimax_m3_kv.config.pool_facts import AITER_ENV, SHUFFLE_KV_ENV

AITER_SPARSE_PA = {AITER_ENV: "1", SHUFFLE_KV_ENV: "1"}
"""AITER on with its sparse paged attention (and the AITER MSA indexer)."""
STOCK_VLLM = {"VLLM_PLUGINS": "lora_filesystem_resolver"}
"""Stock vLLM 0.33: this plugin left out, another installed plugin listed (so
VLLM_PLUGINS is really read, not empty)."""
