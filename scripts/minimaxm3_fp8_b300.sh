#!/usr/bin/env bash
# MiniMax-M3 fp8 on B300: the public B300 recipe's flags, same interface as
# minimaxm3_fp8_mi355x.sh so results compare side by side. Usage: $0 [--dry-run | --help]
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=lib/minimaxm3_fp8_bench.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/minimaxm3_fp8_bench.sh"

TARGET=b300
TARGET_ENV=("VLLM_ENGINE_READY_TIMEOUT_S=${VLLM_ENGINE_READY_TIMEOUT_S:-3600}")
TARGET_FP8_ENV=()
TARGET_BF16_INDEXER_ENV=()
AITER_SPARSE_PA_BY_WORKLOAD=false
COPY_ROCR_TO_HIP=false
TARGET_SERVE_ARGS=()

# The public recipe, for KV_PRECISION=stock (the compare reference).
TARGET_STOCK_FLAGS=(--kv-cache-dtype fp8 --attention-config.indexer_kv_dtype fp8)
TARGET_STOCK_UNSET=()
TARGET_STOCK_SOURCE="InferenceX benchmarks/single_node/fixed_seq_len/minimaxm3_fp8_b300.sh"

minimaxm3_main "$@"
