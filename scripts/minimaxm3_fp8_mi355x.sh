#!/usr/bin/env bash
# MiniMax-M3 on MI355X (gfx950). KV_PRECISION=fp8 (default) is the B300
# recipe's flags, with AITER sparse paged attention on so an fp8 indexer
# exists; bf16 and mixed keep AITER but turn its sparse PA off; compare runs
# several pools in turn. Inputs by environment; --help lists them. Usage:
# $0 [--dry-run | --help]
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=lib/minimaxm3_fp8_bench.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/minimaxm3_fp8_bench.sh"

TARGET=mi355x
TARGET_ENV=(
    VLLM_ROCM_USE_AITER=1
    "VLLM_ENGINE_READY_TIMEOUT_S=${VLLM_ENGINE_READY_TIMEOUT_S:-3600}"
)
TARGET_FP8_ENV=(VLLM_ROCM_SHUFFLE_KV_CACHE_LAYOUT=1)
TARGET_BF16_INDEXER_ENV=(VLLM_ROCM_SHUFFLE_KV_CACHE_LAYOUT=0)
FP8_INDEXER_NEEDS_AITER_SPARSE_PA=true
# Slurm and container runtimes on ROCm set ROCR_VISIBLE_DEVICES; vLLM's ROCm
# platform reads HIP_VISIBLE_DEVICES.
COPY_ROCR_TO_HIP=true
TARGET_SERVE_ARGS=(--attention-backend TRITON_ATTN)

minimaxm3_main "$@"
