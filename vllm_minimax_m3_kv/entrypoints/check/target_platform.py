"""Make a target GPU (and the aiter package) look present, or absent, on a CPU.

``check`` asks stock vLLM what it builds for a GPU this machine lacks by
running vLLM's own config, model build (on the meta device) and KV planning
under that GPU's platform; the test harness simulates its nodes the same way.
The stand-ins answer hardware questions only (which GPU arch, which compute
capability, is aiter installed and with which kernels) and can say "absent"
as readily as "present"; everything that decides something is vLLM's code.
One platform per process: call :func:`simulate` before anything asks
``vllm.platforms.current_platform``.
"""

from __future__ import annotations

import importlib
import shutil
import sys
import tempfile
import types
from pathlib import Path
from typing import Any

# name -> (vendor, arch or capability): check's targets and the harness's nodes
PLATFORMS: dict[str, tuple[str, Any]] = {
    "mi355x": ("rocm", "gfx950"),
    "mi350x": ("rocm", "gfx950"),
    "mi325x": ("rocm", "gfx942"),
    "mi300x": ("rocm", "gfx942"),
    "mi250x": ("rocm", "gfx90a"),
    "rtx-pro-6000": ("cuda", (12, 0)),
    "b300": ("cuda", (10, 3)),
    "b200": ("cuda", (10, 0)),
    "h200": ("cuda", (9, 0)),
    "h100": ("cuda", (9, 0)),
    "l40s": ("cuda", (8, 9)),
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


def _simulate_rocm(arch: str, aiter: str) -> None:
    _stand_in_amdsmi(arch)
    import vllm.platforms as platforms
    from vllm.platforms.rocm import RocmPlatform

    platforms._current_platform = RocmPlatform()
    set_aiter(aiter)


AITER_STATES = ("msa", "no_msa", "absent")
"""aiter installed with the MSA kernels, installed without them, or absent."""

_AITER_FILES = {
    "aiter/__init__.py": "",
    "aiter/ops/__init__.py": "",
    # The MSA indexer's CP gate reads these two kernel limits at model build:
    # one MFMA's columns and one wave's lanes (gfx950 waves are 64).
    "aiter/ops/msa_block_select.py": "SCORE_MFMA_COLS = 16\nTOPK_CP_MAX_CAND = 64\n",
    # Imported by the MSA kernels' launch paths, which never run here.
    "aiter/ops/msa_attention.py": "",
}
_aiter_root: Path | None = None


def set_aiter(state: str) -> None:
    """Make the aiter package present (with or without its MSA kernels) or
    absent, as a directory on ``sys.path`` and as vLLM's availability probe.

    Callable again in the same process: a fix that means "install aiter" is
    applied by switching it back on.
    """
    global _aiter_root
    assert state in AITER_STATES, state
    import vllm._aiter_ops as aiter_ops

    if _aiter_root is None:
        _aiter_root = Path(tempfile.mkdtemp(prefix="sim-aiter-"))
        sys.path.append(str(_aiter_root))
    shutil.rmtree(_aiter_root / "aiter", ignore_errors=True)
    for name in [m for m in sys.modules if m == "aiter" or m.startswith("aiter.")]:
        del sys.modules[name]
    if state != "absent":
        for relative, text in _AITER_FILES.items():
            if state == "no_msa" and "msa_" in relative:
                continue
            path = _aiter_root / relative
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
    importlib.invalidate_caches()
    # The plugin probes aiter's MSA kernels once per process, as vLLM finds
    # aiter once: this switch changed the answer, so it asks again.
    from vllm_minimax_m3_kv.config.facts import aiter_has_msa_kernels

    aiter_has_msa_kernels.cache_clear()
    # vLLM asks these whether aiter could be used (the GPU is CDNA3+ here).
    present = state != "absent"
    aiter_ops.IS_AITER_FOUND = present
    aiter_ops.is_aiter_found_and_supported = lambda: present
    aiter_ops.rocm_aiter_ops.refresh_env_variables()


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

        @classmethod
        def num_compute_units(cls, device_id: int = 0) -> int:
            # Read by backends sizing their launch grids (e.g. Triton MLA);
            # B200's SM count: the figure only sizes buffers here.
            return 148

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


def simulate(platform: str, aiter: str = "msa") -> None:
    """Make ``platform`` the current one; on ROCm, with aiter in that state."""
    vendor, detail = PLATFORMS[platform]
    if vendor == "rocm":
        _simulate_rocm(detail, aiter)
    else:
        _simulate_cuda(detail)


def refresh_rocm_env() -> None:
    """Re-read VLLM_ROCM_* after a scenario changes them (vLLM caches them)."""
    from vllm.platforms import current_platform

    if current_platform.is_rocm():
        from vllm._aiter_ops import rocm_aiter_ops

        rocm_aiter_ops.refresh_env_variables()
