"""What upstream PR 3 changes in the layers vLLM builds, measured.

PR 3 gives each layer that owns a KV cache the dtype of a compressed-tensors
fp8 ``kv_cache_scheme`` from its own quantization config
(``layer_kv_cache_dtype``), as ``Attention.__init__`` already does. Stock vLLM
0.33 applies the scheme only there, and writes ``fp8`` into the shared
``cache_config`` when the first generic ``Attention`` layer is built: layers
that read ``cache_config`` directly and are built before it (MiniMax-M3's
sparse layers before its first dense one), or on a PP stage that builds none,
keep the model dtype.

``python -m tests.upstream.checkpoint_kv_scope --out F`` builds each scenario
with whatever vLLM ``PYTHONPATH`` gives it (stock, or PR 3's overlay; the
plugin excluded) on the meta device, on simulated B300 (``--platform``;
the LFM2-MoE scenario on simulated A100), with the default
torch dtype set to the model's as vLLM's loader sets it, and writes each
layer's KV cache ``dtype/quant mode`` and the config's cache dtype. The
scenarios: MiniMax-M3 (dense first, sparse first, a PP stage with no dense
layer), a Llama, and LFM2-MoE, a hybrid whose ``Attention`` layers get no
quantization config, with its attention backend left to vLLM's selection.
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


def _lfm2_moe_ct_fp8_kv(workdir: Path) -> str:
    """A tiny LFM2-MoE (short convolutions and attention; its Attention layers
    are built without the quantization config) with the same kv_cache_scheme:
    the review's probe of round 3, which turned it from bf16 to fp8."""
    from transformers import Lfm2MoeConfig

    config = Lfm2MoeConfig(
        vocab_size=1024,
        hidden_size=256,
        intermediate_size=512,
        moe_intermediate_size=128,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        num_experts=4,
        num_experts_per_tok=2,
        num_dense_layers=1,
        layer_types=["conv", "full_attention", "conv", "full_attention"],
        architectures=["Lfm2MoeForCausalLM"],
    )
    config.quantization_config = LLAMA_CT_FP8_KV
    path = workdir / "lfm2_moe"
    config.save_pretrained(path)
    return str(path)


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
        "lfm2_moe": {
            "engine": {
                "model": _lfm2_moe_ct_fp8_kv(workdir),
                "max_model_len": 1024,
                "dtype": "bfloat16",
            },
            "pp_rank": None,
            # The review's probe: simulated A100, the backend vLLM selects
            # (on SM10x that is FlashInfer, which asks the driver for the SM
            # count while a layer is built, which this CPU cannot answer).
            "platform": "a100",
            "backend": "selected by vLLM",
        },
    }


def _summary(spec: Any) -> str:
    """An attention spec's ``dtype/quant mode``; a Mamba spec's state dtypes."""
    if hasattr(spec, "kv_quant_mode"):
        return f"{spec.dtype}/{spec.kv_quant_mode.name}"
    return f"{'+'.join(map(str, spec.dtypes))}/state"


def build(
    engine: dict[str, Any], pp_rank: int | None, set_backend: bool = True
) -> dict[str, Any]:
    from vllm.utils.torch_utils import set_default_torch_dtype

    args = sim.make_engine_args(engine, set_backend=set_backend)
    vllm_config = args.create_engine_config()
    config_dtype = vllm_config.cache_config.cache_dtype
    with set_default_torch_dtype(vllm_config.model_config.dtype):
        built = sim.build_model(vllm_config, pp_rank=pp_rank)
    return {
        "config_cache_dtype": config_dtype,
        "layers": {name: _summary(spec) for name, spec in built.specs.items()},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--platform", default="b300", choices=("b300", "a100"))
    parser.add_argument("--out", required=True)
    options = parser.parse_args()
    from vllm_minimax_m3_kv_sim.hardware import simulate

    simulate(options.platform)
    with tempfile.TemporaryDirectory() as workdir:
        results = {
            name: build(
                scenario["engine"],
                scenario["pp_rank"],
                set_backend="backend" not in scenario,
            )
            for name, scenario in scenarios(Path(workdir)).items()
            if scenario.get("platform", "b300") == options.platform
        }
    Path(options.out).write_text(json.dumps(results))


if __name__ == "__main__":
    sys.exit(main())
