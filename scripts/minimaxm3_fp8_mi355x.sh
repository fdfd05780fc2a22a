#!/usr/bin/env bash
# MiniMax-M3 on MI355X (gfx950). KV_PRECISION=fp8 (default) is the B300
# recipe's flags with the public MI355X recipe's AITER setting for the workload
# (sparse paged attention and its MSA indexer from ISL 8192 and CONC 64, else
# AITER unset and vLLM's Triton indexer); bf16 and mixed keep AITER but turn
# its sparse PA off; compare runs several pools in turn. Inputs by environment; --help lists them. Usage:
# $0 [--dry-run | --help]
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=lib/minimaxm3_fp8_bench.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/minimaxm3_fp8_bench.sh"

TARGET=mi355x
# As the public recipe: its engine timeout and CUDA-graph setting in every pool.
TARGET_ENV=(
    "VLLM_ENGINE_READY_TIMEOUT_S=${VLLM_ENGINE_READY_TIMEOUT_S:-3600}"
    VLLM_USE_BREAKABLE_CUDAGRAPH=0
)
TARGET_FP8_ENV=(VLLM_ROCM_USE_AITER=1 VLLM_ROCM_SHUFFLE_KV_CACHE_LAYOUT=1)
TARGET_BF16_INDEXER_ENV=(VLLM_ROCM_USE_AITER=1 VLLM_ROCM_SHUFFLE_KV_CACHE_LAYOUT=0)
AITER_SPARSE_PA_BY_WORKLOAD=true
# Slurm and container runtimes on ROCm set ROCR_VISIBLE_DEVICES; vLLM's ROCm
# platform reads HIP_VISIBLE_DEVICES.
COPY_ROCR_TO_HIP=true
TARGET_SERVE_ARGS=(--attention-backend TRITON_ATTN --tool-call-parser minimax_m3
    --reasoning-parser minimax_m3 --enable-auto-tool-choice)

# The public recipe, for KV_PRECISION=stock (the compare reference).
TARGET_STOCK_FLAGS=(--kv-cache-dtype fp8)
TARGET_STOCK_UNSET=(VLLM_ROCM_USE_AITER VLLM_ROCM_SHUFFLE_KV_CACHE_LAYOUT)
TARGET_STOCK_SOURCE="InferenceX benchmarks/single_node/fixed_seq_len/minimaxm3_fp8_mi355x.sh"

minimaxm3_main "$@"
