"""The ``vllm-minimax-m3-kv`` command line (vLLM's ``entrypoints/cli`` shape)."""
