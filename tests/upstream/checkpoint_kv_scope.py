"""What upstream PR 3 changes in the layers vLLM builds, measured.

PR 3 resolves a compressed-tensors fp8 ``kv_cache_scheme`` into
``--kv-cache-dtype auto`` at config time. Stock vLLM 0.33 applies it only in
``Attention.__init__``, which writes ``fp8`` into the shared ``cache_config``
when the first generic ``Attention`` layer is built: layers built after it
read fp8, layers built before it (and a PP stage that builds none) keep the
model dtype. MiniMax-M3's sparse layers read ``cache_config.cache_dtype``
directly, never through ``Attention.__init__``.

``python -m tests.upstream.checkpoint_kv_scope --out F`` builds each scenario
with whatever vLLM ``PYTHONPATH`` gives it (stock, or PR 3's overlay; the
plugin excluded) on the meta device, on simulated B300, and writes each
layer's KV cache ``dtype/quant mode`` and the config's cache dtype.
``tests/upstream/test_pr3_scope.py`` compares the two builds.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

from vllm_minimax_m3_kv_sim import engine as sim

LLAMA_CT_FP8_KV = {
    "quant_method": "compressed-tensors",
    "format": "float-quantized",
    "quantization_status": "compressed",
    "config_groups": {},
    "ignore": ["lm_head"],
    "kv_cache_scheme": {
        "num_bits": 8,
        "type": "float",
        "strategy": "tensor",
        "dynamic": False,
        "symmetric": True,
    },
}


def _llama_ct_fp8_kv(workdir: Path) -> str:
    """The tiny Llama (generic Attention only) with the same kv_cache_scheme."""
    config = json.loads(Path(sim.TINY_LLAMA, "config.json").read_text())
    config["quantization_config"] = LLAMA_CT_FP8_KV
    (workdir / "config.json").write_text(json.dumps(config))
    return str(workdir)


def scenarios(workdir: Path) -> dict[str, dict[str, Any]]:
    """name -> (engine arguments, PP stage built by its own worker or None)."""
    m3 = {"max_model_len": 8192, "tensor_parallel_size": 4}
    return {
        "minimax_m3_dense_first": {
            "engine": {**m3, "model": sim.TINY_CT_FP8_KV},
            "pp_rank": None,
        },
        "minimax_m3_sparse_first": {
            "engine": {**m3, "model": sim.TINY_CT_FP8_KV_SPARSE_FIRST},
            "pp_rank": None,
        },
        # Layers 3-4 (both sparse): the worker of this stage builds no
        # generic Attention layer.
        "minimax_m3_pp2_sparse_stage": {
            "engine": {
                **m3,
                "model": sim.TINY_CT_FP8_KV,
                "pipeline_parallel_size": 2,
            },
            "pp_rank": 1,
        },
        "llama": {
            "engine": {"model": _llama_ct_fp8_kv(workdir), "max_model_len": 1024},
            "pp_rank": None,
        },
    }


def build(engine: dict[str, Any], pp_rank: int | None) -> dict[str, Any]:
    vllm_config = sim.make_engine_args(engine).create_engine_config()
    config_dtype = vllm_config.cache_config.cache_dtype
    built = sim.build_model(vllm_config, pp_rank=pp_rank)
    return {
        "config_cache_dtype": config_dtype,
        "layers": {
            name: f"{summary[0]}/{summary[1]}"
            for name, summary in sim.spec_summary(built.specs).items()
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    options = parser.parse_args()
    from vllm_minimax_m3_kv_sim.hardware import simulate

    simulate("b300")
    with tempfile.TemporaryDirectory() as workdir:
        results = {
            name: build(scenario["engine"], scenario["pp_rank"])
            for name, scenario in scenarios(Path(workdir)).items()
        }
    Path(options.out).write_text(json.dumps(results))


if __name__ == "__main__":
    sys.exit(main())
