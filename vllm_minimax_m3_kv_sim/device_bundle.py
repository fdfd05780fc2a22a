"""What the lent GPU machine needs to run the device check without vLLM.

The device machine has torch and Triton, not vLLM. The node self-test and the
decode benchmark run vLLM's own MiniMax-M3 indexer kernels, so those sources
are carried verbatim from the installed vLLM (their sha256 in the bundle's
``manifest.json``), under a stand-in ``vllm`` package that answers only what
those sources and the plugin's self-test import: the platform (CUDA, with
vLLM's own PDL rule), Triton, the cache root and a logger. The kernels are
never stood in for.

``python -m vllm_minimax_m3_kv_sim.device_bundle --out device_bundle`` builds
it; ``docs/what-ran-where.md`` has the command that carries it to the device.
"""

from __future__ import annotations

import argparse
import hashlib
import json
from pathlib import Path

from vllm_minimax_m3_kv._versions import installed_version, vllm_source_root

CARRIED = (
    "models/minimax_m3/common/ops/index_topk.py",
    "utils/math_utils.py",
)
"""vLLM's files, relative to its package, copied byte for byte."""

STAND_IN = {
    "__init__.py": '''"""A stand-in vLLM for the device check (vllm_minimax_m3_kv_sim.device_bundle):
vLLM's kernel sources carried verbatim, and only the imports they need."""

STAND_IN = True
''',
    "platforms/__init__.py": '''"""vLLM's CUDA platform, as far as the carried kernels and the self-test ask."""

import torch


class CudaPlatform:
    device_name = "cuda"

    def is_rocm(self) -> bool:
        return False

    def is_cuda(self) -> bool:
        return True

    def is_fp8_fnuz(self) -> bool:
        return False

    def fp8_dtype(self) -> torch.dtype:
        return torch.float8_e4m3fn

    def is_device_capability(self, capability, device_id: int = 0) -> bool:
        # vllm/platforms/interface.py: Platform.is_device_capability (exact).
        if isinstance(capability, int):
            capability = divmod(capability, 10)
        try:
            return tuple(torch.cuda.get_device_capability(device_id)) == tuple(capability)
        except Exception:
            return False

    def is_arch_support_pdl(self) -> bool:
        # vllm/platforms/cuda.py: CudaPlatform.is_arch_support_pdl (SM90+).
        try:
            major, _ = torch.cuda.get_device_capability(torch.cuda.current_device())
        except Exception:
            return False
        return major >= 9


current_platform = CudaPlatform()
''',
    # Outside vLLM's model build, as the device check runs the self-test.
    "config/__init__.py": "def get_current_vllm_config_or_none():\n    return None\n",
    "triton_utils/__init__.py": "import triton\nimport triton.language as tl\n",
    "envs.py": """import os

VLLM_CACHE_ROOT = os.path.expanduser(
    os.getenv("VLLM_CACHE_ROOT", os.path.join("~", ".cache", "vllm"))
)
""",
    "logger.py": """import logging


def init_logger(name: str) -> logging.Logger:
    return logging.getLogger(name)
""",
    "utils/__init__.py": "",
    "models/__init__.py": "",
    "models/minimax_m3/__init__.py": "",
    "models/minimax_m3/common/__init__.py": "",
    "models/minimax_m3/common/ops/__init__.py": "",
    "models/minimax_m3/common/indexer.py": '''"""What vLLM's indexer module imports on CUDA, and nothing else of it."""

from vllm.models.minimax_m3.common.ops.index_topk import (  # noqa: F401
    minimax_m3_index_decode,
    minimax_m3_index_score,
    minimax_m3_index_topk,
)
''',
}


def build(out: Path) -> dict:
    """Write the bundle into ``out`` (``out/vllm/...``); return its manifest."""
    root = vllm_source_root()
    if root is None:
        raise RuntimeError("vLLM is not installed here: its kernel sources are needed")
    package = out / "vllm"
    carried = {}
    for relative in CARRIED:
        data = (root / relative).read_bytes()
        target = package / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
        carried[relative] = hashlib.sha256(data).hexdigest()
    for relative, text in STAND_IN.items():
        target = package / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text, encoding="utf-8")
    manifest = {"vllm": installed_version("vllm"), "carried": carried}
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1), encoding="utf-8")
    return manifest


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("device_bundle"))
    args = parser.parse_args()
    manifest = build(args.out)
    print(
        f"{args.out}: vLLM {manifest['vllm']}, {len(manifest['carried'])} files carried"
    )


if __name__ == "__main__":
    main()
