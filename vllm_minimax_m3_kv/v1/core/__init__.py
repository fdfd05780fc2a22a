"""Glue for ``vllm.v1.core``: KV cache planning."""
