"""``python -m vllm_minimax_m3_kv [check] ...``: the offline preflight."""

from vllm_minimax_m3_kv.entrypoints.cli.main import entry

entry()
