"""MiniMax-M3 model-side hooks: config hook and indexer cache spec."""
