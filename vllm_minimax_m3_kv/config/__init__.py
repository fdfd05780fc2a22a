"""The MiniMax-M3 indexer-precision policy and the facts it decides on.

- The policy, pure (no vLLM, no torch): :mod:`.pool_facts` (the facts' types),
  :mod:`.indexer_precision` (``decide()``), :mod:`.vllm_gates` (vLLM's "does
  an fp8 indexer run here" rules, restated), :mod:`.refusals` and
  :mod:`.verdicts` (what it answers, as values).
- Readers of vLLM's config: :mod:`.facts` (the facts, in one pass) and
  :mod:`.kv_cache_dtype` (what the checkpoint stores for ``auto``).
- :mod:`.recorded_verdict`: the decision, recorded in the engine's config for
  what runs after it.
- :mod:`.targets`: the GPUs ``check`` judges for, and the context in which
  the hook judges for one (check's own pieces that must sit below the hook).

Nothing is imported here.
"""
