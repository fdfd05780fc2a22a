# shellcheck shell=bash
# Shared body of the MiniMax-M3 single-node recipes. A target script sets
# TARGET, TARGET_ENV, TARGET_FP8_ENV and TARGET_BF16_INDEXER_ENV (arrays of
# NAME=VALUE: always, for an fp8 indexer, for a bf16 indexer), TARGET_SERVE_ARGS
# (array), AITER_SPARSE_PA_BY_WORKLOAD, COPY_ROCR_TO_HIP and (optional)
# TARGET_FP8_SELFTEST (true/false: the fp8 pool runs vLLM's Triton indexer),
# and for the stock pool (today's public recipe, plugin off) TARGET_STOCK_FLAGS,
# TARGET_STOCK_UNSET (variables that recipe does not set) and
# TARGET_STOCK_SOURCE (where it comes from), then calls minimaxm3_main "$@". Steps: check inputs, preflight, serve, wait
# for /health, confirm the pool, benchmark, stop the server (on exit, error or
# Ctrl-C).
#
# KV_PRECISION picks the KV pool per workload:
#   stock   today's public recipe for this GPU, verbatim, with this plugin off
#           (the compare reference; on MI355X its AITER setting for the workload,
#           as fp8 takes it)
#   fp8     (default) the B300 recipe: fp8 KV cache and fp8 indexer, one precision;
#           on MI355X with the public recipe's AITER setting for the workload
#           (sparse PA only from ISL 8192 and CONC 64: the AITER MSA indexer;
#           below, AITER unset: vLLM's Triton indexer, node self-test first)
#   bf16    both caches bf16, one precision; on MI355X AITER sparse PA off
#   mixed   fp8 KV cache beside a bf16 indexer (the public MI355X recipe's shape),
#           accepted with VLLM_MINIMAX_M3_KV_ALLOW_MIXED=1: every worker zeroes
#           new blocks
#   compare each pool in COMPARE_POOLS, one server at a time on the same GPUs,
#           the same workload, then one table and the pool to run

REQUIRED_VARS=(MODEL TP EP_SIZE DP_ATTENTION PORT MAX_MODEL_LEN CONC ISL OSL
    RANDOM_RANGE_RATIO RESULT_FILENAME RESULT_DIR)
OPTIONAL_VARS=(KV_PRECISION COMPARE_POOLS MODEL_PATH PP RUN_EVAL LONG_EVAL_LENGTHS LONG_EVAL_DOCS
    RULER_TASKS RULER_EVAL_DOCS LOGPROB_EVAL_LENGTHS LOGPROB_EVAL_DOCS NONINFERIORITY_MARGIN
    NOISE_EVAL_DOCS EVAL_PREFILL_RATE EVAL_TASK EVAL_INCLUDE_PATH
    GPU_MEMORY_UTILIZATION MAX_NUM_BATCHED_TOKENS HOST VLLM_API_KEY HEALTH_TIMEOUT_S
    POOL_LINE_TIMEOUT_S VLLM_ENGINE_READY_TIMEOUT_S VLLM_BIN CHECK_BIN LM_EVAL_BIN)

DEFAULT_KV_PRECISION=fp8
DEFAULT_COMPARE_POOLS="stock fp8"
DEFAULT_HEALTH_TIMEOUT_S=1800
# The scripts' own servers listen on loopback only: the script is their only
# client, and a server on every interface lets anyone skew the A/B.
DEFAULT_HOST=127.0.0.1
DEFAULT_POOL_LINE_TIMEOUT_S=60
DEFAULT_VLLM_BIN=vllm
DEFAULT_CHECK_BIN=vllm-minimax-m3-kv
DEFAULT_LM_EVAL_BIN=lm_eval
# The long-context context lengths (tokens, capped by MAX_MODEL_LEN) and the
# pass-code retrieval prompts per length: a smoke check for broken serving.
DEFAULT_LONG_EVAL_LENGTHS="4096 16384 32768 65536 131072"
DEFAULT_LONG_EVAL_DOCS=30
# lm-eval's RULER tasks that build their prompts offline (no essay haystack,
# no nltk data), at the standard lengths among LONG_EVAL_LENGTHS that fit.
DEFAULT_RULER_TASKS="niah_multikey_2 niah_multikey_3 ruler_vt"
OFFLINE_RULER_TASKS=" niah_single_1 niah_multikey_2 niah_multikey_3 ruler_vt ruler_cwe ruler_fwe "
# Prompts per RULER task and length: 200 (1,200 at the two long lengths, tasks
# pooled) shows a pool with no effect non-inferior by 2 points in at least 80%
# of runs up to 5% run-to-run disagreement, and keeps out a 3-point drop there
# in at least 95% (docs/deploying.md, minimaxm3_paired.py simulate).
DEFAULT_RULER_EVAL_DOCS=200
# compare: the margin (points of long-context accuracy) a candidate must be
# shown to stay within; the reference's RULER rerun at the long lengths (A/B/A,
# prompts per task) that measures run-to-run noise.
DEFAULT_NONINFERIORITY_MARGIN=2
DEFAULT_NOISE_EVAL_DOCS=100
# The prefill rate the dry run's eval budget assumes (prompt tokens/s for the
# node); the run prints the rate it measures.
DEFAULT_EVAL_PREFILL_RATE=20000
# The teacher-forced log-prob pass: document lengths and documents per length.
DEFAULT_LOGPROB_EVAL_LENGTHS="32768 65536 131072"
DEFAULT_LOGPROB_EVAL_DOCS=32
# RUN_EVAL=quick: every eval, a few prompts each (timing and a smoke check; decides nothing).
QUICK_LONG_EVAL_DOCS=10
QUICK_RULER_EVAL_DOCS=10
QUICK_LOGPROB_EVAL_DOCS=4

VLLM_BIN="${VLLM_BIN:-$DEFAULT_VLLM_BIN}"
CHECK_BIN="${CHECK_BIN:-$DEFAULT_CHECK_BIN}"
LM_EVAL_BIN="${LM_EVAL_BIN:-$DEFAULT_LM_EVAL_BIN}"
HEALTH_TIMEOUT_S="${HEALTH_TIMEOUT_S:-$DEFAULT_HEALTH_TIMEOUT_S}"
KV_PRECISION="${KV_PRECISION:-$DEFAULT_KV_PRECISION}"
COMPARE_POOLS="${COMPARE_POOLS:-$DEFAULT_COMPARE_POOLS}"
# Upstream recipes enable AITER sparse paged attention for MiniMax-M3 on
# MI355X only from these (InferenceX PR #2187, vLLM recipes PR #654).
AITER_SPARSE_PA_MIN_ISL=8192
AITER_SPARSE_PA_MIN_CONC=64
SERVER_PID=""
# The pool a compare run is running now (its own bash process).
POOL_PID=""
# The lines the plugin logs once the engine's KV pool is planned.
ACTIVE_LINE="vllm-minimax-m3-kv active:"
ONE_PRECISION_LINE='MiniMax-M3 KV pool: one precision \(.*\) on all [0-9]+ workers; no KV block zeroer is built\.'
MIXED_LINE='MiniMax-M3 KV pool: mixed precision \(.*\); every one of [0-9]+ workers and the scheduler zero newly allocated blocks\.'
# How long the pool line may trail /health (engine-core logs are buffered).
POOL_LINE_TIMEOUT_S="${POOL_LINE_TIMEOUT_S:-$DEFAULT_POOL_LINE_TIMEOUT_S}"
COMPARE_HELPER="$(dirname "${BASH_SOURCE[0]}")/minimaxm3_compare.py"
LONG_EVAL_HELPER="$(dirname "${BASH_SOURCE[0]}")/minimaxm3_longctx.py"
RULER_HELPER="$(dirname "${BASH_SOURCE[0]}")/minimaxm3_ruler.py"
LOGPROB_HELPER="$(dirname "${BASH_SOURCE[0]}")/minimaxm3_logprobs.py"
PAIRED_HELPER="$(dirname "${BASH_SOURCE[0]}")/minimaxm3_paired.py"
# Set in each per-pool run that KV_PRECISION=compare starts.
COMPARE_CHILD="${MINIMAXM3_COMPARE_CHILD:-}"
# Set in the reference's rerun, which serves RULER at the long lengths only.
NOISE_RERUN="${MINIMAXM3_NOISE_RERUN:-}"

usage() {
    cat <<EOF
usage: $0 [--dry-run | --help]

MiniMax-M3 on ${TARGET}: preflight (vllm-minimax-m3-kv check), vllm serve,
wait for /health, confirm the KV pool (the plugin's log lines, then one short
greedy completion whose logprobs must all be finite), vllm bench serve, stop
the server. It starts nothing if PORT is taken, and measures only the server it
started (alive after /health, serving MODEL). --dry-run prints the commands and
runs only the preflight.
KV_PRECISION=compare does this once per pool in COMPARE_POOLS, one server at a
time, and ends with a table and the pool to run (docs/deploying.md).

required environment:
  MODEL               model id or local path to serve
  TP                  tensor parallel size (data parallel size with DP_ATTENTION)
  EP_SIZE             expert parallel size (>1 adds --enable-expert-parallel)
  DP_ATTENTION        true|false (1|0): true runs --data-parallel-size TP --enable-expert-parallel
  PORT                server port
  MAX_MODEL_LEN       --max-model-len
  CONC                benchmark concurrency (CONC*10 prompts)
  ISL                 benchmark input length
  OSL                 benchmark output length
  RANDOM_RANGE_RATIO  benchmark length spread
  RESULT_FILENAME     benchmark result file name
  RESULT_DIR          where results and server.log go (compare: one folder per pool)

optional environment (default):
  KV_PRECISION            fp8 | bf16 | mixed | stock | compare (${DEFAULT_KV_PRECISION})
  COMPARE_POOLS           pools KV_PRECISION=compare runs, the first is the reference (${DEFAULT_COMPARE_POOLS})
  MODEL_PATH              local checkpoint served and judged instead of MODEL (unset)
  PP                      pipeline parallel size (unset)
  RUN_EVAL                true|false (1|0)|quick: after the benchmark, the long-context evals (pass-code
                          retrieval, RULER, teacher-forced log-probs), then gsm8k; quick: a few
                          prompts each, timing and a smoke check that decides nothing (false)
  LONG_EVAL_LENGTHS       retrieval and RULER lengths in tokens, those that fit MAX_MODEL_LEN (${DEFAULT_LONG_EVAL_LENGTHS})
  LONG_EVAL_DOCS          pass-code retrieval prompts per length, a smoke check (${DEFAULT_LONG_EVAL_DOCS}; quick ${QUICK_LONG_EVAL_DOCS})
  RULER_TASKS             lm-eval RULER tasks, of:${OFFLINE_RULER_TASKS}(${DEFAULT_RULER_TASKS})
  RULER_EVAL_DOCS         prompts per RULER task and length (${DEFAULT_RULER_EVAL_DOCS}; quick ${QUICK_RULER_EVAL_DOCS})
  LOGPROB_EVAL_LENGTHS    teacher-forced document lengths, those that fit MAX_MODEL_LEN (${DEFAULT_LOGPROB_EVAL_LENGTHS})
  LOGPROB_EVAL_DOCS       documents per length, each scored twice (${DEFAULT_LOGPROB_EVAL_DOCS}; quick ${QUICK_LOGPROB_EVAL_DOCS})
  NONINFERIORITY_MARGIN   compare: the long-context accuracy drop, in points, a candidate must be
                          shown to stay under to be picked (${DEFAULT_NONINFERIORITY_MARGIN})
  NOISE_EVAL_DOCS         compare: RULER prompts per task at the long lengths in the reference's
                          rerun after the other pools, the run-to-run noise (${DEFAULT_NOISE_EVAL_DOCS}; quick: no rerun)
  EVAL_PREFILL_RATE       prompt tokens/s the eval budget in the dry run assumes (${DEFAULT_EVAL_PREFILL_RATE})
  EVAL_TASK               the short-context sanity task, scored by strict match (gsm8k)
  EVAL_INCLUDE_PATH       lm-eval --include_path, for a task of your own (unset)
  GPU_MEMORY_UTILIZATION  --gpu-memory-utilization (unset: vLLM's default, as the public recipe)
  MAX_NUM_BATCHED_TOKENS  --max-num-batched-tokens (unset: vLLM's default, as the public recipe)
  HOST                    address vllm serve listens on (${DEFAULT_HOST}: this machine only; 0.0.0.0
                          listens on every interface, the script still talks to 127.0.0.1)
  VLLM_API_KEY            API key vllm serve requires (vLLM reads it); the script's own requests,
                          vllm bench serve (as OPENAI_API_KEY), lm-eval and the helpers send it (unset)
  HEALTH_TIMEOUT_S        seconds to wait for /health (${DEFAULT_HEALTH_TIMEOUT_S})
  POOL_LINE_TIMEOUT_S     seconds the KV pool line may trail /health (${DEFAULT_POOL_LINE_TIMEOUT_S})
  VLLM_ENGINE_READY_TIMEOUT_S  vLLM's engine start timeout (3600)
  VLLM_BIN                vllm command (${DEFAULT_VLLM_BIN})
  CHECK_BIN               preflight command (${DEFAULT_CHECK_BIN})
  LM_EVAL_BIN             lm-eval command for RUN_EVAL (${DEFAULT_LM_EVAL_BIN})

set for vllm serve on your behalf (${TARGET}):
$(set_on_your_behalf)
EOF
}

set_on_your_behalf() {
    # What export_target_env sets, from the target's own arrays.
    local pair
    for pair in "${TARGET_ENV[@]}"; do
        echo "  ${pair%%=*}=${pair#*=}  (always)"
    done
    local bf16=" ${TARGET_BF16_INDEXER_ENV[*]} " fp8=" ${TARGET_FP8_ENV[*]} "
    # When fp8 sets its variables: always, or (MI355X) only where the public
    # recipe turns AITER sparse PA on; below that it unsets them.
    local when_fp8="KV_PRECISION=fp8"
    if [[ "$AITER_SPARSE_PA_BY_WORKLOAD" == true ]]; then
        when_fp8+=" from ISL=${AITER_SPARSE_PA_MIN_ISL} and CONC=${AITER_SPARSE_PA_MIN_CONC}, unset below"
    fi
    for pair in "${TARGET_FP8_ENV[@]}"; do
        if [[ "$bf16" == *" $pair "* ]]; then
            echo "  ${pair}  (${when_fp8}; KV_PRECISION=bf16 or mixed; replaces your value)"
        else
            echo "  ${pair}  (${when_fp8}; replaces your value)"
        fi
    done
    for pair in "${TARGET_BF16_INDEXER_ENV[@]}"; do
        [[ "$fp8" == *" $pair "* ]] ||
            echo "  ${pair}  (KV_PRECISION=bf16 or mixed; replaces your value)"
    done
    echo "  VLLM_MINIMAX_M3_KV_ALLOW_MIXED=1  (KV_PRECISION=mixed)"
    echo "  VLLM_PLUGINS=<every installed general plugin but this one>  (KV_PRECISION=stock)"
    local name
    for name in "${TARGET_STOCK_UNSET[@]}"; do
        if [[ "$AITER_SPARSE_PA_BY_WORKLOAD" == true ]]; then
            echo "  ${name} unset  (KV_PRECISION=stock below ISL=${AITER_SPARSE_PA_MIN_ISL}" \
                "or CONC=${AITER_SPARSE_PA_MIN_CONC}; from there =1, as the public recipe)"
        else
            echo "  ${name} unset  (KV_PRECISION=stock)"
        fi
    done
    if [[ "$COPY_ROCR_TO_HIP" == true ]]; then
        echo "  HIP_VISIBLE_DEVICES=\$ROCR_VISIBLE_DEVICES  (when ROCR_VISIBLE_DEVICES is set)"
    fi
}

usage_error() {
    echo "error: $1" >&2
    echo "       required: ${REQUIRED_VARS[*]}" >&2
    echo "       optional: ${OPTIONAL_VARS[*]} ($0 --help)" >&2
    exit 64
}

is_boolean() {
    [[ "$1" =~ ^(true|false|1|0)$ ]]
}

is_true() {
    [[ "$1" == true || "$1" == 1 ]]
}

require_inputs() {
    # $1: true for a dry run, which prints the eval command without running it.
    local dry_run="${1:-false}" missing=() name
    for name in "${REQUIRED_VARS[@]}"; do
        [[ -n "${!name:-}" ]] || missing+=("$name")
    done
    if ((${#missing[@]})); then
        usage_error "set these environment variables: ${missing[*]}"
    fi
    if [[ -n "${DP_ATTENTION:-}" ]] && ! is_boolean "$DP_ATTENTION"; then
        usage_error "DP_ATTENTION=${DP_ATTENTION} is not one of: true false 1 0"
    fi
    if [[ -n "${RUN_EVAL:-}" && "$RUN_EVAL" != quick ]] && ! is_boolean "$RUN_EVAL"; then
        usage_error "RUN_EVAL=${RUN_EVAL} is not one of: true false 1 0 quick"
    fi
    if run_eval; then
        long_eval_tasks >/dev/null
        for name in LONG_EVAL_DOCS RULER_EVAL_DOCS LOGPROB_EVAL_DOCS NOISE_EVAL_DOCS EVAL_PREFILL_RATE; do
            [[ -z "${!name:-}" || "${!name}" =~ ^[1-9][0-9]*$ ]] ||
                usage_error "${name}=${!name} is not a positive number"
        done
        [[ -z "${NONINFERIORITY_MARGIN:-}" || "$NONINFERIORITY_MARGIN" =~ ^([1-9][0-9]*|[0-9]*\.[0-9]*[1-9][0-9]*)$ ]] ||
            usage_error "NONINFERIORITY_MARGIN=${NONINFERIORITY_MARGIN} is not a positive number of points"
        local task ruler_tasks
        read -r -a ruler_tasks <<<"${RULER_TASKS-$DEFAULT_RULER_TASKS}"
        for task in "${ruler_tasks[@]}"; do
            [[ "$OFFLINE_RULER_TASKS" == *" $task "* ]] ||
                usage_error "RULER_TASKS has ${task}; each is one of:${OFFLINE_RULER_TASKS}(the others need a hub download)"
        done
    fi
    if run_eval && [[ "$dry_run" != true ]] && ! command -v "$LM_EVAL_BIN" >/dev/null 2>&1; then
        echo "error: RUN_EVAL=${RUN_EVAL} needs ${LM_EVAL_BIN} on PATH;" \
            "install it with: pip install 'lm-eval[api,ruler]' (or unset RUN_EVAL)" >&2
        exit 64
    fi
}

run_eval() {
    [[ "${RUN_EVAL:-}" == quick ]] || is_true "${RUN_EVAL:-false}"
}

eval_docs() {
    # Prompts (documents) per length for one eval: the operator's value, else
    # RUN_EVAL=quick's, else the default.
    local name="$1" quick="QUICK_$1" default="DEFAULT_$1"
    if [[ -n "${!name:-}" ]]; then
        echo "${!name}"
    elif [[ "${RUN_EVAL:-}" == quick ]]; then
        echo "${!quick}"
    else
        echo "${!default}"
    fi
}

long_eval_tasks() {
    # The long-context task names for the lengths that fit MAX_MODEL_LEN; the
    # helper says why when none does.
    python3 "$LONG_EVAL_HELPER" tasks \
        --lengths "${LONG_EVAL_LENGTHS:-$DEFAULT_LONG_EVAL_LENGTHS}" \
        --max-model-len "$MAX_MODEL_LEN" || exit 64
}

ruler_lengths() {
    # RULER's standard lengths among LONG_EVAL_LENGTHS that fit; none: the
    # helper's reason on stderr and nothing on stdout.
    [[ -n "${RULER_TASKS-$DEFAULT_RULER_TASKS}" ]] || return 0
    python3 "$RULER_HELPER" lengths \
        --lengths "${LONG_EVAL_LENGTHS:-$DEFAULT_LONG_EVAL_LENGTHS}" \
        --max-model-len "$MAX_MODEL_LEN" || true
}

primary_lengths() {
    # The RULER lengths the primary test pools (the rule's own choice).
    (($#)) || return 0
    python3 "$PAIRED_HELPER" primary --lengths "$*"
}

logprob_lengths() {
    python3 "$LOGPROB_HELPER" lengths \
        --lengths "${LOGPROB_EVAL_LENGTHS:-$DEFAULT_LOGPROB_EVAL_LENGTHS}" \
        --max-model-len "$MAX_MODEL_LEN" || true
}

grouped() {
    # 1234567 -> 1,234,567 (no locale needed).
    local n="$1" out=""
    while ((n >= 1000)); do
        out="$(printf ',%03d' $((n % 1000)))$out"
        n=$((n / 1000))
    done
    echo "$n$out"
}

sum_of() {
    local total=0 n
    for n in "$@"; do total=$((total + n)); done
    echo "$total"
}

plan_prompt_tokens() {
    # PLANNED: "step:tokens" for what this pool sends as prompt tokens, from
    # the lengths that fit MAX_MODEL_LEN and the documents per length (the
    # bench's input lengths are the mean; gsm8k's short prompts not counted).
    PLANNED=("bench:$((CONC * 10 * ISL))")
    run_eval || return 0
    if [[ -n "$NOISE_RERUN" ]]; then
        local tasks=()
        read -r -a tasks <<<"${RULER_TASKS-$DEFAULT_RULER_TASKS}"
        PLANNED=("bench:0" "RULER (the rerun):$(($(eval_docs RULER_EVAL_DOCS) * ${#tasks[@]} * $(sum_of "${RULER_LENGTHS[@]}")))")
        return 0
    fi
    local names=() lengths=() name tasks=()
    IFS=, read -r -a names <<<"$(long_eval_tasks 2>/dev/null)"
    for name in "${names[@]}"; do lengths+=("${name##*_}"); done
    PLANNED+=("long-context retrieval:$(($(eval_docs LONG_EVAL_DOCS) * $(sum_of "${lengths[@]}")))")
    read -r -a tasks <<<"${RULER_TASKS-$DEFAULT_RULER_TASKS}"
    if ((${#RULER_LENGTHS[@]})); then
        PLANNED+=("RULER:$(($(eval_docs RULER_EVAL_DOCS) * ${#tasks[@]} * $(sum_of "${RULER_LENGTHS[@]}")))")
    fi
    if ((${#LOGPROB_CMD[@]})); then
        read -r -a lengths <<<"$(logprob_lengths 2>/dev/null)"
        # Each document is scored twice (the rerun shows the pool's own noise).
        PLANNED+=("log-probs:$(($(eval_docs LOGPROB_EVAL_DOCS) * 2 * $(sum_of "${lengths[@]}")))")
    fi
}

planned_total() {
    local step total=0
    for step in "${PLANNED[@]}"; do total=$((total + ${step##*:})); done
    echo "$total"
}

print_planned_tokens() {
    local step
    echo "== planned prompt tokens (this pool; gsm8k's short prompts not counted)"
    for step in "${PLANNED[@]}"; do
        [[ "${step##*:}" == 0 ]] || echo "  ${step%%:*}: $(grouped "${step##*:}")"
    done
    echo "  total: $(grouped "$(planned_total)")"
    run_eval || return 0
    # The evals' budget at an assumed rate, in tenths of an hour.
    local rate="${EVAL_PREFILL_RATE:-$DEFAULT_EVAL_PREFILL_RATE}" evals gpus tenths
    evals=$(($(planned_total) - ${PLANNED[0]##*:}))
    gpus=$((TP * ${PP:-1}))
    tenths=$(((evals * 10 + rate * 3600 - 1) / (rate * 3600)))
    echo "  evals at EVAL_PREFILL_RATE=$(grouped "$rate") prompt tokens/s (assumed; the run" \
        "prints its measured rate): about $((tenths / 10)).$((tenths % 10)) h," \
        "$(((tenths * gpus + 9) / 10)) GPU-hours at TP=${TP}${PP:+ PP=${PP}}"
}

eval_progress() {
    # After each eval step: what is done, the prompt-token rate measured since
    # the evals started, and the time left at that rate.
    local label="$1" tokens="$2" elapsed rate left
    EVAL_DONE_TOKENS=$((EVAL_DONE_TOKENS + tokens))
    elapsed=$((SECONDS - EVAL_STARTED))
    ((elapsed > 0)) || elapsed=1
    rate=$((EVAL_DONE_TOKENS / elapsed))
    left=$((EVAL_TOTAL_TOKENS - EVAL_DONE_TOKENS))
    ((left > 0)) || left=0
    echo "  done: ${label} ($(grouped "$tokens") prompt tokens); evals ${elapsed}s so far," \
        "$(grouped "$rate") prompt tokens/s; about $((left / (rate > 0 ? rate : 1) / 60 + 1)) min left" \
        "for $(grouped "$left") more"
}

shell_words() {
    # The words as a shell reads them back: a word with characters the shell
    # would interpret (a JSON argument) is single-quoted, so a printed command
    # runs as printed.
    local word quoted=()
    for word in "$@"; do
        if [[ "$word" =~ ^[A-Za-z0-9_./:=,@%+-]+$ ]]; then
            quoted+=("$word")
        else
            quoted+=("'${word//\'/\'\\\'\'}'")
        fi
    done
    echo "${quoted[*]}"
}

ruler_cmd() {
    # RULER_CMD: lm-eval's RULER tasks at one length. RULER builds its own
    # prompts, sized by the served checkpoint's tokenizer; one lm-eval run per
    # length so that --limit takes that many prompts at each.
    local length="$1" tasks
    tasks="$(tr -s ' ' ',' <<<"${RULER_TASKS-$DEFAULT_RULER_TASKS}")"
    RULER_CMD=("$LM_EVAL_BIN" --model local-completions --tasks "$tasks"
        --model_args "$EVAL_MODEL_ARGS"
        --metadata "{\"max_seq_lengths\":[${length}],\"tokenizer\":\"${SERVED_MODEL}\"}"
        --limit "$(eval_docs RULER_EVAL_DOCS)"
        --output_path "$RESULT_DIR/eval_ruler/${length}" --log_samples)
}

precision_choice() {
    # PRECISION_FLAGS / PRECISION_ENV / PRECISION_NOTE for KV_PRECISION.
    case "$KV_PRECISION" in
    fp8)
        PRECISION_FLAGS=(--kv-cache-dtype fp8 --attention-config.indexer_kv_dtype fp8)
        PRECISION_NOTE="uniform fp8: fp8 KV cache and fp8 indexer, no zeroer"
        EXPECTED_POOL_LINE="$ONE_PRECISION_LINE"
        if [[ "$AITER_SPARSE_PA_BY_WORKLOAD" == true ]] && ! aiter_sparse_pa_pays; then
            # The public recipe's setting for this workload: AITER unset, so
            # stock and fp8 differ in the KV pool alone.
            PRECISION_UNSET=("${TARGET_STOCK_UNSET[@]}")
            PRECISION_NOTE+="; AITER unset as the public recipe for ISL=${ISL} CONC=${CONC}: vLLM's Triton indexer"
            RUN_SELFTEST=true
        else
            PRECISION_ENV=("${TARGET_FP8_ENV[@]}")
            # gfx942: the fp8 index cache runs on vLLM's Triton indexer too.
            if [[ "${TARGET_FP8_SELFTEST:-false}" == true ]]; then
                RUN_SELFTEST=true
            fi
        fi
        ;;
    bf16)
        PRECISION_FLAGS=(--kv-cache-dtype auto)
        PRECISION_ENV=("${TARGET_BF16_INDEXER_ENV[@]}")
        PRECISION_NOTE="uniform bf16: both caches bf16, no zeroer"
        EXPECTED_POOL_LINE="$ONE_PRECISION_LINE"
        ;;
    mixed)
        PRECISION_FLAGS=(--kv-cache-dtype fp8 --attention-config.indexer_kv_dtype bf16)
        PRECISION_ENV=(VLLM_MINIMAX_M3_KV_ALLOW_MIXED=1
            "${TARGET_BF16_INDEXER_ENV[@]}")
        PRECISION_NOTE="mixed: fp8 KV cache, bf16 indexer; every worker zeroes new blocks"
        EXPECTED_POOL_LINE="$MIXED_LINE"
        ;;
    stock)
        # The public recipe as published: its precision flags, its AITER
        # setting for this workload (as the fp8 pool takes it, so the two
        # differ in the KV pool alone), and this plugin not loaded.
        PRECISION_FLAGS=("${TARGET_STOCK_FLAGS[@]}")
        PRECISION_ENV=("VLLM_PLUGINS=$(plugins_without_this_one)")
        PRECISION_NOTE="stock: today's public ${TARGET} recipe (${TARGET_STOCK_SOURCE}), vllm-minimax-m3-kv off"
        if [[ "$AITER_SPARSE_PA_BY_WORKLOAD" == true ]] && aiter_sparse_pa_pays; then
            PRECISION_ENV+=("${TARGET_FP8_ENV[@]}")
            PRECISION_NOTE+="; AITER sparse PA on as the public recipe for ISL=${ISL} CONC=${CONC}"
        else
            PRECISION_UNSET=("${TARGET_STOCK_UNSET[@]}")
        fi
        EXPECTED_POOL_LINE=""
        ;;
    *)
        echo "error: KV_PRECISION=${KV_PRECISION} is not one of: fp8 bf16 mixed stock compare" >&2
        exit 64
        ;;
    esac
}

plugins_without_this_one() {
    # VLLM_PLUGINS as vLLM reads it, less this plugin: the listed names, or
    # every installed vllm.general_plugins entry point when it is unset. This
    # plugin's entry point is found by its package, as pyproject declares it.
    python3 - <<'PY'
import os
from importlib.metadata import entry_points

installed = entry_points(group="vllm.general_plugins")
ours = {ep.name for ep in installed if ep.module.partition(".")[0] == "vllm_minimax_m3_kv"}
listed = os.environ.get("VLLM_PLUGINS")
names = listed.split(",") if listed is not None else [ep.name for ep in installed]
print(",".join(sorted({n for n in names if n and n not in ours})))
PY
}

aiter_sparse_pa_pays() {
    # Upstream enables AITER sparse PA for MiniMax-M3 on MI355X only from
    # this input length and concurrency (InferenceX PR #2187, vLLM recipes
    # PR #654); below, it measured slower.
    ((ISL >= AITER_SPARSE_PA_MIN_ISL && CONC >= AITER_SPARSE_PA_MIN_CONC))
}

parallel_args() {
    # DP attention + expert parallel, or TP (+ EP), as in the public recipe.
    if is_true "$DP_ATTENTION"; then
        PARALLEL_ARGS=(--data-parallel-size "$TP" --enable-expert-parallel)
    elif ((EP_SIZE > 1)); then
        PARALLEL_ARGS=(--tensor-parallel-size "$TP" --enable-expert-parallel)
    else
        PARALLEL_ARGS=(--tensor-parallel-size "$TP")
    fi
    if [[ -n "${PP:-}" ]]; then
        PARALLEL_ARGS+=(--pipeline-parallel-size "$PP")
    fi
}

build_commands() {
    parallel_args
    SERVED_MODEL="${MODEL_PATH:-$MODEL}"
    # Everything but the precision flags: the public recipe's run shares them.
    local shared=(
        --block-size 128
        --language-model-only
        --no-enable-prefix-caching
        --max-model-len "$MAX_MODEL_LEN"
        "${PARALLEL_ARGS[@]}"
        "${TARGET_SERVE_ARGS[@]}"
    )
    # Only where asked: the public recipe leaves both at vLLM's defaults.
    [[ -z "${GPU_MEMORY_UTILIZATION:-}" ]] ||
        shared+=(--gpu-memory-utilization "$GPU_MEMORY_UTILIZATION")
    [[ -z "${MAX_NUM_BATCHED_TOKENS:-}" ]] ||
        shared+=(--max-num-batched-tokens "$MAX_NUM_BATCHED_TOKENS")
    SERVE_FLAGS=("${PRECISION_FLAGS[@]}" "${shared[@]}")
    SERVE_CMD=("$VLLM_BIN" serve "$SERVED_MODEL" --host "$(serve_host)" --port "$PORT"
        "${SERVE_FLAGS[@]}")
    BENCH_CMD=("$VLLM_BIN" bench serve
        --model "$SERVED_MODEL" --host "$(client_host)" --port "$PORT"
        --dataset-name random
        --random-input-len "$ISL" --random-output-len "$OSL"
        --random-range-ratio "$RANDOM_RANGE_RATIO"
        --num-prompts "$((CONC * 10))" --max-concurrency "$CONC"
        --save-result --result-dir "$RESULT_DIR"
        --result-filename "$RESULT_FILENAME")
    # tokenizer_backend=none: lm-eval sends text and needs no tokenizer of its
    # own (else it asks /tokenizer_info, which vllm serve answers only with
    # --enable-tokenizer-info-endpoint, then imports transformers).
    EVAL_MODEL_ARGS="model=${SERVED_MODEL},base_url=$(base_url)/v1/completions,num_concurrent=${CONC},tokenized_requests=False,tokenizer_backend=none"
    EVAL_CMD=("$LM_EVAL_BIN" --model local-completions --tasks "${EVAL_TASK:-gsm8k}"
        --model_args "$EVAL_MODEL_ARGS" --output_path "$RESULT_DIR/eval")
    [[ -z "${EVAL_INCLUDE_PATH:-}" ]] || EVAL_CMD+=(--include_path "$EVAL_INCLUDE_PATH")
    # The long-context tasks are built against the running server (its
    # tokenizer sizes each prompt), then run like any include-path task.
    local lengths=(--lengths "${LONG_EVAL_LENGTHS:-$DEFAULT_LONG_EVAL_LENGTHS}"
        --max-model-len "$MAX_MODEL_LEN")
    LONG_EVAL_BUILD_CMD=(python3 "$LONG_EVAL_HELPER" build "${lengths[@]}"
        --host "$(client_host)" --port "$PORT" --model "$SERVED_MODEL"
        --docs "$(eval_docs LONG_EVAL_DOCS)"
        --out-dir "$RESULT_DIR/long_context")
    LONG_EVAL_CMD=() RULER_LENGTHS=() LOGPROB_CMD=()
    if run_eval; then
        local tasks fit
        tasks="$(long_eval_tasks)"
        # --log_samples: each prompt's outcome, which the paired rule compares.
        LONG_EVAL_CMD=("$LM_EVAL_BIN" --model local-completions --tasks "$tasks"
            --model_args "$EVAL_MODEL_ARGS" --include_path "$RESULT_DIR/long_context"
            --output_path "$RESULT_DIR/eval_long_context" --log_samples)
        read -r -a RULER_LENGTHS <<<"$(ruler_lengths 2>/dev/null)"
        fit="$(logprob_lengths 2>/dev/null)"
        if [[ -n "$NOISE_RERUN" ]]; then
            # The reference again: RULER at the primary lengths, nothing else.
            read -r -a RULER_LENGTHS <<<"$(primary_lengths "${RULER_LENGTHS[@]}")"
            LONG_EVAL_CMD=() fit=""
        fi
        [[ -z "$fit" ]] ||
            LOGPROB_CMD=(python3 "$LOGPROB_HELPER" run --host "$(client_host)" --port "$PORT"
                --model "$SERVED_MODEL" --lengths "$fit"
                --max-model-len "$MAX_MODEL_LEN"
                --docs "$(eval_docs LOGPROB_EVAL_DOCS)"
                --out "$RESULT_DIR/logprobs.json")
    fi
    PROBE_CMD=(python3 "$COMPARE_HELPER" probe --host "$(client_host)" --port "$PORT"
        --model "$SERVED_MODEL" --max-model-len "$MAX_MODEL_LEN"
        --out "$RESULT_DIR/agreement.json")
    # The preflight judges exactly what will be served: MODEL_PATH (a typo
    # fails here, not after launch), or MODEL if it is a local directory. A
    # hub id is judged on the bundled config (the checkpoint's architecture
    # values), which needs no download.
    CHECK_CMD=("$CHECK_BIN" check --target "$TARGET")
    CHECK_MODEL_NOTE=""
    if [[ -n "${MODEL_PATH:-}" ]]; then
        CHECK_CMD+=("$MODEL_PATH")
    elif [[ -d "$MODEL" ]]; then
        CHECK_CMD+=("$MODEL")
    else
        CHECK_MODEL_NOTE="MODEL=${MODEL} is a hub id: the preflight judges the bundled MiniMax-M3 config"
    fi
    RECIPE_CHECK_CMD=("${CHECK_CMD[@]}" "${TARGET_STOCK_FLAGS[@]}" "${shared[@]}")
    CHECK_CMD+=("${SERVE_FLAGS[@]}")
}

capacity_vs_public_recipe() {
    # check's capacity row compares with stock vLLM running this very
    # command; an operator asks what this pool holds against today's public
    # recipe (KV_PRECISION=stock): check's bytes per token for each, from
    # one --json run of each.
    [[ "$KV_PRECISION" != stock ]] || return 0
    local ours recipe recipe_env=() name
    ours=$("${CHECK_CMD[@]}" --json 2>/dev/null) || true
    if [[ "$AITER_SPARSE_PA_BY_WORKLOAD" == true ]] && aiter_sparse_pa_pays; then
        recipe_env=("${TARGET_FP8_ENV[@]}")
    else
        for name in "${TARGET_STOCK_UNSET[@]}"; do recipe_env+=(-u "$name"); done
    fi
    recipe=$(env "${recipe_env[@]}" VLLM_PLUGINS="$(plugins_without_this_one)" \
        "${RECIPE_CHECK_CMD[@]}" --json 2>/dev/null) || true
    python3 - "$ours" "$recipe" "$TARGET" <<'PY'
import json, sys

try:
    ours, recipe = (json.loads(text)["bytes_per_token_total"] for text in sys.argv[1:3])
except (ValueError, KeyError, TypeError):
    print("  capacity vs today's public recipe: not computed (check printed no plan)")
else:
    print(
        f"  capacity vs today's public {sys.argv[3]} recipe on stock vLLM 0.33: "
        f"{recipe / ours:.2f}x the KV tokens ({ours:,} vs {recipe:,} bytes/token)"
    )
PY
}

export_target_env() {
    local pair name
    for name in "${PRECISION_UNSET[@]}"; do
        if [[ -n "${!name+set}" ]]; then
            echo "note: ${name}=${!name} from your environment is unset for" \
                "KV_PRECISION=${KV_PRECISION} (the public recipe does not set it)"
        fi
        unset "$name"
    done
    for pair in "${TARGET_ENV[@]}" "${PRECISION_ENV[@]}"; do
        name="${pair%%=*}"
        if [[ -n "${!name:-}" && "${!name}" != "${pair#*=}" ]]; then
            echo "note: ${name}=${!name} from your environment is replaced by" \
                "${pair#*=} for KV_PRECISION=${KV_PRECISION}"
        fi
        export "${pair?}"
    done
    if [[ "$COPY_ROCR_TO_HIP" == true && -n "${ROCR_VISIBLE_DEVICES:-}" ]]; then
        export HIP_VISIBLE_DEVICES="$ROCR_VISIBLE_DEVICES"
    fi
}

node_selftest() {
    # vLLM's indexer scorers on an fp8 index cache, on this node's GPU, before
    # the server starts (each worker runs it again before selecting them).
    local dry_run="$1" code=0
    echo "== node self-test: ${CHECK_BIN} selftest"
    [[ "$dry_run" != true ]] || return 0
    "$CHECK_BIN" selftest || code=$?
    if ((code == 2)); then
        echo "note: the node self-test did not run (no GPU in this process)"
    elif ((code != 0)); then
        echo "error: the node self-test failed (exit ${code}); not launching" \
            "(docs/troubleshooting.md)" >&2
        exit 2
    fi
}

stop_server() {
    if [[ -n "$SERVER_PID" ]] && kill -0 "$SERVER_PID" 2>/dev/null; then
        kill -TERM -- "-$SERVER_PID" 2>/dev/null || kill -TERM "$SERVER_PID"
        local waited=0
        while kill -0 "$SERVER_PID" 2>/dev/null && ((waited < 30)); do
            sleep 1
            waited=$((waited + 1))
        done
        kill -KILL -- "-$SERVER_PID" 2>/dev/null || true
        # Gone, every process of its group, before anything else starts on
        # these GPUs (the next pool, or the job scheduler's next job).
        wait "$SERVER_PID" 2>/dev/null || true
        waited=0
        while kill -0 -- "-$SERVER_PID" 2>/dev/null && ((waited < 50)); do
            sleep 0.2
            waited=$((waited + 1))
        done
    fi
    SERVER_PID=""
}

stop_pool() {
    # A compare run told to stop (a job scheduler's cancel sends TERM to this
    # process alone): stop the running pool's foreground step, so that its
    # own EXIT trap stops its server, then wait until it has.
    [[ -n "$POOL_PID" ]] || return 0
    pkill -TERM -P "$POOL_PID" 2>/dev/null || true
    kill -TERM "$POOL_PID" 2>/dev/null || true
    wait "$POOL_PID" 2>/dev/null || true
    POOL_PID=""
}

fail_with_log() {
    # In a compare run the one error line names the pool it stopped at.
    local pool=""
    [[ -z "$COMPARE_CHILD" ]] || pool="KV_PRECISION=${KV_PRECISION}: "
    echo "error: ${pool}$1; last lines of $SERVER_LOG:" >&2
    tail -n 40 "$SERVER_LOG" >&2 || true
    exit 1
}

serve_host() {
    echo "${HOST:-$DEFAULT_HOST}"
}

client_host() {
    # Where the script reaches its own server: a wildcard listen address is
    # reached on loopback.
    case "$(serve_host)" in
    0.0.0.0 | "::" | "[::]") echo 127.0.0.1 ;;
    *) serve_host ;;
    esac
}

base_url() {
    echo "http://$(client_host):${PORT}"
}

api_curl() {
    # curl to the script's own server, with the API key where one is set
    # (read from the environment, never printed).
    local auth=()
    [[ -z "${VLLM_API_KEY:-}" ]] || auth=(-H "Authorization: Bearer ${VLLM_API_KEY}")
    curl -sf "${auth[@]}" "$@"
}

refuse_if_port_taken() {
    # Before anything starts: a server already on PORT (another team's vLLM)
    # would answer /health and be measured as this pool.
    local pool=""
    [[ -z "$COMPARE_CHILD" ]] || pool="KV_PRECISION=${KV_PRECISION}: "
    if ! python3 - "$(serve_host)" "$PORT" <<'PY'; then
import socket, sys
host, port = sys.argv[1], int(sys.argv[2])
family = socket.AF_INET6 if ":" in host else socket.AF_INET
with socket.socket(family, socket.SOCK_STREAM) as sock:
    # As the server binds (uvicorn sets SO_REUSEADDR): only a listener, not
    # the last pool's closed connections, makes the port taken.
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host.strip("[]"), port))
    except OSError:
        sys.exit(1)
PY
        echo "error: ${pool}PORT=${PORT} is already in use on $(serve_host) (another server?);" \
            "nothing started; set PORT to a free port" >&2
        exit 2
    fi
}

wait_for_health() {
    local deadline=$((SECONDS + HEALTH_TIMEOUT_S))
    until api_curl "$(base_url)/health" >/dev/null 2>&1; do
        kill -0 "$SERVER_PID" 2>/dev/null || fail_with_log "the server exited"
        ((SECONDS < deadline)) ||
            fail_with_log "no /health within ${HEALTH_TIMEOUT_S}s"
        sleep 2
    done
    # Health means this script's server: still alive once the port answers,
    # and serving the model it was started with.
    kill -0 "$SERVER_PID" 2>/dev/null ||
        fail_with_log "a server answers on PORT=${PORT}, but not the one this script started (it exited)"
    local models
    models=$(api_curl "$(base_url)/v1/models") ||
        fail_with_log "the server on PORT=${PORT} answers /health but not /v1/models"
    python3 -c '
import json, sys
ids = [m.get("id") for m in json.loads(sys.stdin.read()).get("data", [])]
sys.exit(0 if sys.argv[1] in ids else 1)
' "$SERVED_MODEL" <<<"$models" ||
        fail_with_log "the server on PORT=${PORT} does not serve ${SERVED_MODEL}: not the one this script started"
}

confirm_pool() {
    if [[ "$KV_PRECISION" == stock ]]; then
        # Stock vLLM has nothing to say about its pool; what must hold is
        # that this plugin did not load.
        ! grep -qF "$ACTIVE_LINE" "$SERVER_LOG" ||
            fail_with_log "the server log has a '${ACTIVE_LINE}' line: KV_PRECISION=stock must run without the plugin (VLLM_PLUGINS=${VLLM_PLUGINS:-})"
        echo "  no '${ACTIVE_LINE}' line: stock vLLM"
        return 0
    fi
    # The plugin's own account of the pool this server built, from its log.
    grep -qF "$ACTIVE_LINE" "$SERVER_LOG" ||
        fail_with_log "no '${ACTIVE_LINE}' line in the server log: the plugin is not loaded (is it installed in this environment, and not left out by VLLM_PLUGINS?)"
    local deadline=$((SECONDS + POOL_LINE_TIMEOUT_S))
    until grep -qE "$EXPECTED_POOL_LINE" "$SERVER_LOG"; do
        ((SECONDS < deadline)) ||
            fail_with_log "the server log has no KV pool line matching '${EXPECTED_POOL_LINE}' for KV_PRECISION=${KV_PRECISION}"
        sleep 1
    done
    echo "  $(grep -oE "$EXPECTED_POOL_LINE" "$SERVER_LOG" | head -n 1)"
}

confirm_finite_logprobs() {
    # One short greedy completion: every token's logprob must be a number.
    local body response
    body=$(printf '{"model": "%s", "prompt": "%s", "max_tokens": 8, "temperature": 0, "logprobs": 1}' \
        "$SERVED_MODEL" "The capital of France is")
    response=$(api_curl "$(base_url)/v1/completions" \
        -H 'Content-Type: application/json' -d "$body") ||
        fail_with_log "the confirmation completion request failed"
    local verdict
    verdict=$(python3 -c '
import json, math, sys
logprobs = json.loads(sys.stdin.read())["choices"][0]["logprobs"]["token_logprobs"]
bad = [x for x in logprobs if x is None or not math.isfinite(x)]
print("ok" if logprobs and not bad else f"{len(bad)} of {len(logprobs)} logprobs not finite: {bad[:4]}")
' <<<"$response") || verdict="unreadable completion response"
    [[ "$verdict" == ok ]] ||
        fail_with_log "the confirmation completion returned ${verdict}"
    echo "  completion: 8 greedy tokens, logprobs finite"
}

run_ruler() {
    # RULER at each of RULER_LENGTHS, with progress after each.
    local length tasks=()
    read -r -a tasks <<<"${RULER_TASKS-$DEFAULT_RULER_TASKS}"
    for length in "${RULER_LENGTHS[@]}"; do
        echo "== RULER at ${length} tokens"
        ruler_cmd "$length"
        "${RULER_CMD[@]}" || fail_with_log "lm-eval RULER at ${length} tokens failed (exit $?)"
        eval_progress "RULER at ${length} tokens" \
            "$(($(eval_docs RULER_EVAL_DOCS) * ${#tasks[@]} * length))"
    done
}

run_pool() {
    # One pool: this script again in a process of its own, in the background
    # and waited for, so that a signal to this process is handled at once.
    local pool="$1" dir="$2"
    shift 2
    KV_PRECISION="$pool" RESULT_DIR="$dir" MINIMAXM3_COMPARE_CHILD=1 bash "$0" "$@" &
    POOL_PID=$!
    local status=0
    wait "$POOL_PID" || status=$?
    POOL_PID=""
    return "$status"
}

compare_pools() {
    # Each pool is this script run again with KV_PRECISION=<pool> in a process
    # of its own: its environment cannot leak into the next pool's, and its
    # server is stopped (by its own EXIT trap) before the next one starts.
    local pools pool seen=" " status=0 done_pools=()
    read -r -a pools <<<"$COMPARE_POOLS"
    for pool in "${pools[@]}"; do
        case "$pool" in
        fp8 | bf16 | mixed | stock) ;;
        *) usage_error "COMPARE_POOLS has ${pool}; each pool is one of: stock fp8 bf16 mixed" ;;
        esac
        [[ "$seen" != *" $pool "* ]] || usage_error "COMPARE_POOLS names ${pool} twice"
        seen+="$pool "
    done
    ((${#pools[@]} >= 2)) || usage_error "COMPARE_POOLS=${COMPARE_POOLS} names fewer than two pools"
    local report_cmd=(python3 "$COMPARE_HELPER" report --result-dir "$RESULT_DIR"
        --result-filename "$RESULT_FILENAME"
        --workload "ISL=${ISL} OSL=${OSL} CONC=${CONC} TP=${TP} MAX_MODEL_LEN=${MAX_MODEL_LEN}"
        --eval-task "${EVAL_TASK:-gsm8k}"
        --margin "${NONINFERIORITY_MARGIN:-$DEFAULT_NONINFERIORITY_MARGIN}")
    [[ "${RUN_EVAL:-}" != quick ]] || report_cmd+=(--quick)
    report_cmd+=("${pools[@]}")
    [[ "${1:-}" == --dry-run ]] || refuse_if_port_taken
    echo "== ${TARGET}: KV_PRECISION=compare: ${pools[*]}, one server at a time; reference ${pools[0]}"
    trap 'stop_pool; exit 143' TERM
    trap 'stop_pool; exit 130' INT
    trap 'stop_pool; exit 129' HUP
    for pool in "${pools[@]}"; do
        echo "== compare: KV_PRECISION=${pool} (results in ${RESULT_DIR}/${pool})"
        run_pool "$pool" "${RESULT_DIR}/${pool}" "$@" || status=$?
        if ((status != 0)); then
            local left=("${pools[@]:${#done_pools[@]}+1}")
            echo "== compare stopped at KV_PRECISION=${pool} (exit ${status});" \
                "not run: ${left[*]:-none}"
            exit "$status"
        fi
        done_pools+=("$pool")
    done
    # A/B/A: the reference served again after the others, RULER at the long
    # lengths on its first prompts, so the report measures run-to-run noise.
    if run_eval && [[ "${RUN_EVAL}" != quick && -n "$(ruler_lengths 2>/dev/null)" ]]; then
        local rerun_docs="${NOISE_EVAL_DOCS:-$DEFAULT_NOISE_EVAL_DOCS}"
        local ruler_docs
        ruler_docs="$(eval_docs RULER_EVAL_DOCS)"
        ((rerun_docs <= ruler_docs)) || rerun_docs="$ruler_docs"
        echo "== compare: noise rerun: KV_PRECISION=${pools[0]} again" \
            "(results in ${RESULT_DIR}/${pools[0]}-rerun)"
        RULER_EVAL_DOCS="$rerun_docs" MINIMAXM3_NOISE_RERUN=1 \
            run_pool "${pools[0]}" "${RESULT_DIR}/${pools[0]}-rerun" "$@" || status=$?
        if ((status != 0)); then
            echo "== compare stopped at the noise rerun of KV_PRECISION=${pools[0]} (exit ${status})"
            exit "$status"
        fi
    fi
    echo "== compare report: $(shell_words "${report_cmd[@]}")"
    if [[ "${1:-}" == --dry-run ]]; then
        echo "== dry run: nothing started"
        return 0
    fi
    "${report_cmd[@]}"
}

minimaxm3_main() {
    local dry_run=false
    case "${1:-}" in
    --dry-run) dry_run=true ;;
    -h | --help)
        usage
        exit 0
        ;;
    "") ;;
    *)
        echo "error: unknown option $1 (options: --dry-run, --help)" >&2
        usage >&2
        exit 64
        ;;
    esac
    require_inputs "$dry_run"
    if [[ "$KV_PRECISION" == compare ]]; then
        compare_pools "$@"
        return 0
    fi
    PRECISION_ENV=() PRECISION_UNSET=() RUN_SELFTEST=false
    precision_choice
    export_target_env
    build_commands

    echo "== ${TARGET}: KV_PRECISION=${KV_PRECISION} (${PRECISION_NOTE})"
    echo "== ${TARGET}: environment"
    printf '  %s\n' "${TARGET_ENV[@]}" "${PRECISION_ENV[@]}"
    [[ -z "${HIP_VISIBLE_DEVICES:-}" ]] || echo "  HIP_VISIBLE_DEVICES=$HIP_VISIBLE_DEVICES"
    echo "== serve"
    echo "  $(shell_words "${SERVE_CMD[@]}")"
    if [[ -n "$NOISE_RERUN" ]]; then
        echo "== noise rerun: RULER at the long lengths only, the same first prompts"
        local length
        for length in "${RULER_LENGTHS[@]}"; do
            ruler_cmd "$length"
            echo "  $(shell_words "${RULER_CMD[@]}")"
        done
    fi
    if [[ -n "$COMPARE_CHILD" && -z "$NOISE_RERUN" ]]; then
        echo "== agreement probe"
        echo "  $(shell_words "${PROBE_CMD[@]}")"
    fi
    [[ -n "$NOISE_RERUN" ]] || echo "== bench"
    [[ -n "$NOISE_RERUN" ]] || echo "  $(shell_words "${BENCH_CMD[@]}")"
    if run_eval && [[ -z "$NOISE_RERUN" ]]; then
        echo "== eval: long context (what the index cache decides), then gsm8k"
        echo "  pass-code retrieval (a smoke check for breakage):"
        echo "  $(shell_words "${LONG_EVAL_BUILD_CMD[@]}")"
        echo "  $(shell_words "${LONG_EVAL_CMD[@]}")"
        if ((${#RULER_LENGTHS[@]})); then
            echo "  RULER (multi-key needles, variable tracking), one lm-eval run per length:"
            local length
            for length in "${RULER_LENGTHS[@]}"; do
                ruler_cmd "$length"
                echo "  $(shell_words "${RULER_CMD[@]}")"
            done
        elif [[ -z "${RULER_TASKS-$DEFAULT_RULER_TASKS}" ]]; then
            echo "  RULER: not run (RULER_TASKS is empty)"
        else
            echo "  not run: $(ruler_lengths 2>&1)"
        fi
        if ((${#LOGPROB_CMD[@]})); then
            echo "  teacher-forced log-probs (each document scored twice: the rerun shows the pool's own noise):"
            echo "  $(shell_words "${LOGPROB_CMD[@]}")"
        else
            echo "  not run: $(logprob_lengths 2>&1)"
        fi
        echo "  short-context sanity check:"
        echo "  $(shell_words "${EVAL_CMD[@]}")"
    fi
    plan_prompt_tokens
    print_planned_tokens
    echo "== preflight: $(shell_words "${CHECK_CMD[@]}")"
    [[ -z "$CHECK_MODEL_NOTE" ]] || echo "  ($CHECK_MODEL_NOTE)"
    local verdict=0
    "${CHECK_CMD[@]}" || verdict=$?
    # check exits 3 for a mixed pool the operator opted into, and for stock
    # vLLM's mixed pool (the plugin off).
    if ! [[ "$verdict" == 0 || ("$verdict" == 3 && "$KV_PRECISION" =~ ^(mixed|stock)$) ]]; then
        echo "error: ${COMPARE_CHILD:+KV_PRECISION=${KV_PRECISION}: }preflight failed" \
            "for ${TARGET} (check exit ${verdict}); not launching" >&2
        exit 2
    fi
    capacity_vs_public_recipe
    if [[ "$RUN_SELFTEST" == true ]]; then
        node_selftest "$dry_run"
    fi
    if [[ "$dry_run" == true ]]; then
        [[ -n "$COMPARE_CHILD" ]] || echo "== dry run: nothing started"
        return 0
    fi

    refuse_if_port_taken
    # vllm bench serve and lm-eval send OPENAI_API_KEY; vLLM reads VLLM_API_KEY.
    [[ -z "${VLLM_API_KEY:-}" ]] || export OPENAI_API_KEY="$VLLM_API_KEY"
    mkdir -p "$RESULT_DIR"
    SERVER_LOG="$RESULT_DIR/server.log"
    trap stop_server EXIT
    trap 'exit 130' INT
    trap 'exit 143' TERM
    trap 'exit 129' HUP
    # A session of its own, so stopping it stops every worker it spawned.
    setsid "${SERVE_CMD[@]}" >"$SERVER_LOG" 2>&1 &
    SERVER_PID=$!
    wait_for_health
    echo "== server healthy; confirming the KV pool"
    confirm_pool
    confirm_finite_logprobs
    # Progress and time left, from the prompt-token rate the evals reach.
    local step
    EVAL_STARTED=$SECONDS EVAL_DONE_TOKENS=0 EVAL_TOTAL_TOKENS=0
    for step in "${PLANNED[@]:1}"; do
        EVAL_TOTAL_TOKENS=$((EVAL_TOTAL_TOKENS + ${step##*:}))
    done
    if [[ -n "$NOISE_RERUN" ]]; then
        run_ruler
        echo "== results in $RESULT_DIR"
        return 0
    fi
    if [[ -n "$COMPARE_CHILD" ]]; then
        # Greedy, one request at a time, before any load: what the pool
        # itself changes, not what batching does.
        "${PROBE_CMD[@]}" || fail_with_log "the agreement probe failed"
    fi
    echo "== benchmarking"
    "${BENCH_CMD[@]}" || fail_with_log "the benchmark failed (exit $?)"
    if run_eval; then
        EVAL_STARTED=$SECONDS
        echo "== long-context retrieval eval: building its prompts with the served tokenizer"
        "${LONG_EVAL_BUILD_CMD[@]}" >/dev/null ||
            fail_with_log "building the long-context eval failed (exit $?)"
        "${LONG_EVAL_CMD[@]}" || fail_with_log "lm-eval long-context retrieval failed (exit $?)"
        eval_progress "long-context retrieval" "${PLANNED[1]##*:}"
        run_ruler
        if ((${#LOGPROB_CMD[@]})); then
            echo "== teacher-forced log-probs"
            "${LOGPROB_CMD[@]}" || fail_with_log "the teacher-forced log-prob pass failed (exit $?)"
            eval_progress "teacher-forced log-probs" "${PLANNED[-1]##*:}"
        fi
        echo "== short-context sanity check: ${EVAL_TASK:-gsm8k}"
        "${EVAL_CMD[@]}" || fail_with_log "lm-eval ${EVAL_TASK:-gsm8k} failed (exit $?)"
    fi
    echo "== results in $RESULT_DIR/$RESULT_FILENAME"
}
