#!/usr/bin/env bash
# MiniMax-M3 on MI300X / MI325X (gfx942). KV_PRECISION=fp8 (default) is the B300
# recipe's flags on gfx942: an fp8 KV cache (e4m3fnuz) and an fp8 index cache in the
# same bytes, filled by the plugin's writer and read by vLLM's Triton indexer (node
# self-test first); AITER sparse PA stays off (vLLM's AITER MSA indexer is gfx950
# only). The public MI300X recipe keeps a bf16 KV cache: it is KV_PRECISION=stock,
# the compare reference. Inputs by environment; --help lists them. Usage:
# $0 [--dry-run | --help]
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=lib/minimaxm3_fp8_bench.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/minimaxm3_fp8_bench.sh"

TARGET=mi300x
# As the public recipe: its engine timeout and CUDA-graph setting in every pool.
TARGET_ENV=(
    "VLLM_ENGINE_READY_TIMEOUT_S=${VLLM_ENGINE_READY_TIMEOUT_S:-3600}"
    VLLM_USE_BREAKABLE_CUDAGRAPH=0
)
# gfx942: no AITER sparse PA beside vLLM's Triton indexer (AITER itself may stay).
TARGET_FP8_ENV=(VLLM_ROCM_SHUFFLE_KV_CACHE_LAYOUT=0)
TARGET_BF16_INDEXER_ENV=(VLLM_ROCM_SHUFFLE_KV_CACHE_LAYOUT=0)
TARGET_FP8_SELFTEST=true
AITER_SPARSE_PA_BY_WORKLOAD=false
# Slurm and container runtimes on ROCm set ROCR_VISIBLE_DEVICES; vLLM's ROCm
# platform reads HIP_VISIBLE_DEVICES.
COPY_ROCR_TO_HIP=true
TARGET_SERVE_ARGS=(--attention-backend TRITON_ATTN --tool-call-parser minimax_m3
    --reasoning-parser minimax_m3 --enable-auto-tool-choice)

# The public recipe, for KV_PRECISION=stock (the compare reference): bf16 KV.
TARGET_STOCK_FLAGS=(--kv-cache-dtype auto)
TARGET_STOCK_UNSET=(VLLM_ROCM_USE_AITER VLLM_ROCM_SHUFFLE_KV_CACHE_LAYOUT)
TARGET_STOCK_SOURCE="InferenceX benchmarks/single_node/fixed_seq_len/minimaxm3_fp8_mi300x.sh"

minimaxm3_main "$@"
