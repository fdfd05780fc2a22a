"""Every Triton kernel the plugin routes an fp8 index cache to on ROCm, or
ships, compiled for the GPU's own ISA on this CPU machine.

Triton's AMD backend builds the code object (``hsaco``) without a GPU; only
running it needs one. Each child (``tests/kernels/rocm_aot.py``) calls vLLM's
own kernel wrappers under a simulated MI355X or MI300X with the launches
turned into compiles for gfx950 or gfx942 (``vllm_minimax_m3_kv_sim/aot.py``).
What this does not show: that the code runs right on the GPU (the node
self-test does that), or how fast.
"""

from __future__ import annotations

import functools

import pytest

from vllm_minimax_m3_kv_sim.plumbing.children import json_from_out_file

CHILD = ["-m", "tests.kernels.rocm_aot"]
TARGETS = {
    "mi355x": ("gfx950", "*fp8e4nv"),  # OCP e4m3fn
    "mi300x": ("gfx942", "*fp8e4b8"),  # e4m3fnuz
}
HEADS = (1, 4)
SHAPES = ("q1", "q1mtp", "q2mtp")


@functools.cache
def _compile(hardware: str) -> dict:
    # No interpreter: Triton compiles for real.
    env = {"CUDA_VISIBLE_DEVICES": "", "HIP_VISIBLE_DEVICES": ""}
    return json_from_out_file([*CHILD, "--hardware", hardware], env, timeout=1200)


@pytest.fixture(scope="module", params=sorted(TARGETS))
def compiled(request) -> tuple[str, dict]:
    return request.param, _compile(request.param)


def _kernels(out: dict, case: str) -> list[dict]:
    result = out["cases"][case]
    assert "error" not in result, f"{case}: {result.get('error')}"
    return result["kernels"]


def test_every_routed_scorer_compiles_for_the_isa_at_serving_shapes(compiled):
    hardware, out = compiled
    arch, fp8 = TARGETS[hardware]
    assert out["arch"] == arch
    cases = [f"prefill:h{h}" for h in HEADS]
    cases += [
        f"decode:h{h}:{s}:{n}" for h in HEADS for s in SHAPES for n in ("3k", "64k")
    ]
    for case in cases:
        kernels = _kernels(out, case)
        assert kernels, case
        for kernel in kernels:
            assert kernel["target"] == f"amdgcn-amd-amdhsa--{arch}", (case, kernel)
            assert kernel["hsaco_bytes"] > 0, (case, kernel)
        # The scorer reads the cache and the index query in the fp8 type.
        scorer = kernels[0]
        assert set(scorer["pointers"].values()) >= {fp8, "*fp32"}, (case, scorer)
        assert "*bf16" not in scorer["pointers"].values(), (case, scorer)


def test_prefill_scores_on_the_isas_native_fp8_matrix_unit(compiled):
    hardware, out = compiled
    for heads in HEADS:
        scorer = _kernels(out, f"prefill:h{heads}")[0]
        assert scorer["kernel"] == "_index_block_score_kernel"
        native = "f8f6f4" if hardware == "mi355x" else "fp8_fp8"
        assert any(native in op for op in scorer["mfma"]), scorer["mfma"]


def test_the_prefill_top_k_compiles_in_every_autotune_config(compiled):
    _, out = compiled
    topk = [
        k for k in _kernels(out, "prefill:h1") if k["kernel"] == "_topk_index_kernel"
    ]
    assert len(topk) == 6  # vLLM's six configs; the GPU picks one


def test_a_bf16_query_against_an_fp8_cache_fails_wherever_vllm_takes_tl_dot(compiled):
    # CUDA's scorers upcast a mismatched pair; ROCm's do not: only the GEMV
    # path (one head, no MTP) compiles it. The model allocates the index
    # query in the cache's dtype, so serving never passes this pair.
    hardware, out = compiled
    fp8 = TARGETS[hardware][1].removeprefix("*")
    for heads in HEADS:
        for shape in SHAPES:
            result = out["cases"][f"bf16_query:h{heads}:{shape}"]
            if heads == 1 and shape == "q1":
                assert "kernels" in result, result
            else:
                assert f"Unsupported lhs dtype {fp8}" in result["error"], result


def test_the_opt_in_balanced_decode_scorer_compiles_on_gfx950():
    # VLLM_MINIMAX_M3_KV_FP8_BALANCED_DECODE=1 routes fp8 to vLLM's tuned
    # kernel, which vLLM's policy keeps for gfx950.
    out = _compile("mi355x")
    for heads in HEADS:
        for shape in SHAPES:
            scorer = _kernels(out, f"balanced:h{heads}:{shape}")[0]
            assert scorer["kernel"] == "_decode_index_score_balanced_kernel"
            assert "*fp8e4nv" in scorer["pointers"].values()


def test_the_plugins_fnuz_writer_compiles_for_gfx942():
    out = _compile("mi300x")
    (writer,) = _kernels(out, "writer")
    assert writer["kernel"] == "clamp_cast_index_kernel"
    assert writer["target"] == "amdgcn-amd-amdhsa--gfx942"
    assert writer["hsaco_bytes"] > 0
