"""Make an accelerator (and the aiter package) look present on a CPU machine.

Test scaffolding only. The stand-ins answer hardware questions (which GPU
arch, which compute capability, is aiter importable); everything that decides
something -- vLLM's config, model construction, KV planning, and this plugin --
is the real code. One platform per process: call :func:`simulate` before
anything asks ``vllm.platforms.current_platform``.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types
from typing import Any

# name -> (vendor, arch or capability)
PLATFORMS: dict[str, tuple[str, Any]] = {
    "mi355x": ("rocm", "gfx950"),
    "mi300x": ("rocm", "gfx942"),
    "b300": ("cuda", (10, 3)),
    "b200": ("cuda", (10, 0)),
    "h200": ("cuda", (9, 0)),
    "a100": ("cuda", (8, 0)),
}


def _stand_in_amdsmi(arch: str) -> None:
    amdsmi = types.ModuleType("amdsmi")

    class AmdSmiException(Exception):
        pass

    class AmdSmiMemoryType:
        VRAM = 0

    amdsmi.AmdSmiException = AmdSmiException
    amdsmi.AmdSmiMemoryType = AmdSmiMemoryType
    amdsmi.amdsmi_get_gpu_asic_info = lambda handle: {"target_graphics_version": arch}
    amdsmi.amdsmi_get_gpu_device_uuid = lambda handle: "sim-0"
    amdsmi.amdsmi_get_gpu_memory_total = lambda handle, kind: 288 << 30
    amdsmi.amdsmi_get_processor_handles = lambda: [object()]
    amdsmi.amdsmi_init = lambda *args: None
    amdsmi.amdsmi_shut_down = lambda *args: None
    amdsmi.amdsmi_topo_get_link_type = lambda *args: {}
    amdsmi.amdsmi_topo_get_numa_node_number = lambda *args: 0
    sys.modules["amdsmi"] = amdsmi


def _simulate_rocm(arch: str) -> None:
    _stand_in_amdsmi(arch)
    import vllm.platforms as platforms
    from vllm.platforms.rocm import RocmPlatform

    platforms._current_platform = RocmPlatform()
    # The aiter package is absent here; vLLM asks this one function whether it
    # could be used, then reads VLLM_ROCM_USE_AITER itself.
    import vllm._aiter_ops as aiter_ops

    aiter_ops.is_aiter_found_and_supported = lambda: True
    aiter_ops.rocm_aiter_ops.refresh_env_variables()
    _stand_in_aiter_constants()


class _AiterConstantsFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Serves ``aiter.ops.msa_block_select``'s two kernel limits, nothing else.

    The MSA indexer's CP gate reads them at model build: one MFMA's columns
    and one wave's lanes (gfx950 waves are 64). Only imports of that module
    (and its parent packages) are answered, so nothing else sees an aiter.
    """

    MODULES = ("aiter", "aiter.ops", "aiter.ops.msa_block_select")

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname not in self.MODULES:
            return None
        is_package = fullname != self.MODULES[-1]
        return importlib.machinery.ModuleSpec(fullname, self, is_package=is_package)

    def create_module(self, spec: Any) -> None:
        return None

    def exec_module(self, module: types.ModuleType) -> None:
        if module.__name__ == self.MODULES[-1]:
            module.SCORE_MFMA_COLS = 16
            module.TOPK_CP_MAX_CAND = 64


def _stand_in_aiter_constants() -> None:
    sys.meta_path.append(_AiterConstantsFinder())


def _simulate_cuda(capability: tuple[int, int]) -> None:
    # vllm/platforms/cuda.py imports the CUDA extension (needs libcuda) and
    # fa_utils imports flash-attn names; neither is used to decide anything.
    sys.modules.setdefault("vllm._C_stable_libtorch", types.ModuleType("_C_stable"))
    flash = types.ModuleType("vllm.vllm_flash_attn")
    for name in (
        "compile_flash_attn_varlen_func_from_specs",
        "flash_attn_varlen_func",
        "get_scheduler_metadata",
    ):
        setattr(flash, name, None)
    sys.modules["vllm.vllm_flash_attn"] = flash
    import vllm._custom_ops as custom_ops
    import vllm.platforms as platforms
    from vllm.platforms.cuda import NonNvmlCudaPlatform
    from vllm.platforms.interface import DeviceCapability

    for probe in dir(custom_ops):
        if probe.startswith("cutlass_") and "supports" in probe:
            setattr(custom_ops, probe, lambda *args, **kwargs: False)

    class SimulatedCudaPlatform(NonNvmlCudaPlatform):
        @classmethod
        def get_device_capability(cls, device_id: int = 0) -> DeviceCapability:
            return DeviceCapability(*capability)

        @classmethod
        def get_device_name(cls, device_id: int = 0) -> str:
            return f"simulated sm_{capability[0]}{capability[1]}"

        @classmethod
        def get_device_total_memory(cls, device_id: int = 0) -> int:
            return 192 << 30

        @classmethod
        def device_count(cls) -> int:
            return 8

    platforms._current_platform = SimulatedCudaPlatform()
    _stand_in_cuda_extension_ops()
    if capability[0] == 9:
        _import_sm90_autotune_tables(platforms, SimulatedCudaPlatform)


def _import_sm90_autotune_tables(platforms: Any, simulated: type) -> None:
    # On sm90 one Mamba op module filters its Triton autotune configs at import,
    # and on a CPU machine vLLM's Triton placeholder has no configs to filter.
    # Import it once as a non-sm90 GPU: only kernel tuning tables differ.
    current = platforms._current_platform

    class _NotSm90(simulated):
        @classmethod
        def is_device_capability(cls, capability: Any, device_id: int = 0) -> bool:
            return False

    platforms._current_platform = _NotSm90()
    try:
        import vllm.model_executor.layers.mamba.ops.ssd_chunk_scan  # noqa: F401
    finally:
        platforms._current_platform = current


class _AbsentKernel:
    """A compiled CUDA op looked up while a layer is built; never called here."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(f"simulated CUDA: kernel {self.name} cannot run on CPU")

    def __getattr__(self, name: str) -> Any:
        return _AbsentKernel(f"{self.name}.{name}")


class _AbsentExtension:
    def __init__(self, namespace: str) -> None:
        self.namespace = namespace

    def __getattr__(self, name: str) -> Any:
        return _AbsentKernel(f"{self.namespace}::{name}")


def _stand_in_cuda_extension_ops() -> None:
    # Layers bind torch.ops._C.<kernel> in __init__ on CUDA; the extension
    # needs libcuda, which a CPU machine lacks. Lookups succeed, calls fail.
    import torch

    for namespace in ("_C", "_moe_C", "_C_cache_ops", "_C_custom_ar"):
        torch.ops.__dict__[namespace] = _AbsentExtension(namespace)


def simulate(platform: str) -> None:
    vendor, detail = PLATFORMS[platform]
    if vendor == "rocm":
        _simulate_rocm(detail)
    else:
        _simulate_cuda(detail)


def refresh_rocm_env() -> None:
    """Re-read VLLM_ROCM_* after a scenario changes them (vLLM caches them)."""
    from vllm.platforms import current_platform

    if current_platform.is_rocm():
        from vllm._aiter_ops import rocm_aiter_ops

        rocm_aiter_ops.refresh_env_variables()
