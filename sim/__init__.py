"""MiniMax-M3 on a simulated accelerator, for the tests and the benchmarks.

Real vLLM 0.33 config, model construction (meta device) and KV planning on a
CPU machine; the stand-ins in :mod:`sim.hardware` only make hardware, or the
aiter package, look present or absent. Not part of the installed plugin.
"""
