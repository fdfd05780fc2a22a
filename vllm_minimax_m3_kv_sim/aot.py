"""Compile Triton kernels for an AMD GPU on a machine without one.

Triton's AMD backend compiles to ``hsaco`` anywhere: only launching needs the
GPU. :func:`compiling_for` makes Triton see an active HIP device of the given
architecture (a stand-in driver that answers the target and nothing else) and
turns every launch in its scope into Triton's own warm-up (compile, do not
run), so vLLM's kernel wrappers run as they would on that GPU and every kernel
they would launch is compiled, for the shapes and dtypes they pass, by
Triton's real compiler. An autotuned kernel compiles every config (which one
wins is the GPU's call). Run it in a process of its own: Triton keeps one
active driver per process.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

WAVE_SIZE = {"gfx950": 64, "gfx942": 64}


@dataclass
class Compiled:
    """One kernel compiled for the target, as the wrapper launched it."""

    kernel: str
    pointers: dict[str, str]
    """Pointer arguments and their Triton element types (``*fp8e4nv``)."""
    target: str
    """The ISA the code object was built for (``amdgcn-amd-amdhsa--gfx950``)."""
    hsaco_bytes: int
    mfma: list[str] = field(default_factory=list)
    """The matrix instructions in its code (``v_mfma_f32_16x16x32_fp8_fp8``)."""


class _TargetOnlyDriver:
    """Triton's active driver as a compile-only run needs it: a device, a
    stream, and the target to compile for. Nothing here can launch."""

    def __init__(self, target: Any) -> None:
        self.target = target

    def get_current_target(self) -> Any:
        return self.target

    def get_current_device(self) -> int:
        return 0

    def get_current_stream(self, device: int | None = None) -> int:
        return 0

    def is_active(self) -> bool:
        return True

    def get_active_torch_device(self) -> Any:
        import torch

        return torch.device("cpu")


def _describe(fn: Any, kernel: Any) -> Compiled:
    asm = kernel.asm["amdgcn"]
    target = re.search(r'\.amdgcn_target "([^"]+)"', asm)
    signature = kernel.src.signature if hasattr(kernel, "src") else {}
    if not signature:
        signature = getattr(kernel.metadata, "signature", {}) or {}
    return Compiled(
        kernel=fn.__name__,
        pointers={k: v for k, v in signature.items() if str(v).startswith("*")},
        target=target.group(1) if target else "",
        hsaco_bytes=len(kernel.asm["hsaco"]),
        mfma=sorted(set(re.findall(r"v_mfma_\w+", asm))),
    )


@contextmanager
def compiling_for(arch: str) -> Iterator[list[Compiled]]:
    """Within the scope, launches compile for ``arch`` and do not run; the
    list yielded fills with what was compiled."""
    from triton.backends.compiler import GPUTarget
    from triton.runtime import driver
    from triton.runtime.autotuner import Autotuner
    from triton.runtime.jit import JITFunction, KernelInterface

    compiled: list[Compiled] = []
    getitem, tune = KernelInterface.__getitem__, Autotuner.run

    def compile_only(self: Any, grid: Any) -> Any:
        def launch(*args: Any, **kwargs: Any) -> Any:
            return self.run(*args, grid=grid, warmup=True, **kwargs)

        return launch

    run = JITFunction.run

    def recording_run(self: Any, *args: Any, grid: Any, warmup: bool, **kwargs: Any):
        kernel = run(self, *args, grid=grid, warmup=True, **kwargs)
        compiled.append(_describe(self.fn, kernel))
        return kernel

    def every_config(self: Any, *args: Any, **kwargs: Any) -> None:
        self.nargs = dict(zip(self.arg_names, args, strict=False))
        for config in self.configs:
            self.fn.run(*args, **kwargs, **config.all_kwargs())

    previous = driver._active  # reset_active would look for a real GPU
    driver.set_active(_TargetOnlyDriver(GPUTarget("hip", arch, WAVE_SIZE[arch])))
    KernelInterface.__getitem__ = compile_only
    JITFunction.run = recording_run
    Autotuner.run = every_config
    try:
        yield compiled
    finally:
        KernelInterface.__getitem__ = getitem
        JITFunction.run = run
        Autotuner.run = tune
        driver._active = previous
