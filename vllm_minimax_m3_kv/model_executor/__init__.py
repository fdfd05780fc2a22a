"""vLLM model-executor glue, named after the vLLM modules it touches."""
