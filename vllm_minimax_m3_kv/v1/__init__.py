"""Glue for vLLM v1 engine code (``vllm.v1``)."""
