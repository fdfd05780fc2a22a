#!/usr/bin/env bash
# MiniMax-M3 fp8 on MI355X (gfx950): the B300 recipe's flags, with AITER
# sparse paged attention on so an fp8 indexer exists. Inputs by environment;
# see scripts/lib/minimaxm3_fp8_bench.sh. Usage: $0 [--dry-run]
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=lib/minimaxm3_fp8_bench.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/minimaxm3_fp8_bench.sh"

TARGET=mi355x
TARGET_ENV=(
    VLLM_ROCM_USE_AITER=1
    VLLM_ROCM_SHUFFLE_KV_CACHE_LAYOUT=1
    "VLLM_ENGINE_READY_TIMEOUT_S=${VLLM_ENGINE_READY_TIMEOUT_S:-3600}"
)
TARGET_SERVE_ARGS=(--attention-backend TRITON_ATTN)

minimaxm3_main "$@"
