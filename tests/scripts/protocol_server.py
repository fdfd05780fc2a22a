"""A `vllm serve` for the launch-script tests, built from vLLM 0.33's own
protocol classes, so the real `vllm bench serve` client and real lm-eval can
be run against it on a CPU.

``python -m tests.scripts.protocol_server serve MODEL --port P --max-model-len N
[any other vllm serve flags]``

Requests are validated by vLLM's ``CompletionRequest`` and
``TokenizeCompletionRequest`` (a body vLLM would refuse gets HTTP 400);
responses are vLLM's ``CompletionResponse`` / ``CompletionStreamResponse``
with ``CompletionLogProbs``, ``TokenizeResponse`` and ``ModelList``. Prompts
are tokenized with the checkpoint's own tokenizer, as vLLM does, and one past
``--max-model-len`` minus ``max_tokens`` is refused with HTTP 400. The tokens
it "generates" depend on the prompt alone; a prompt ending in ``Answer:``
gets a gsm8k-style answer, ``#### N``, N from the prompt, or, asked for a
vault's pass code (the long-context retrieval eval), the code the prompt
gives for that vault. RULER's multi-key needle questions (lm-eval's
``niah_multikey_*``, asked through their answer prefix) get the values the
prompt gives for the asked key, and its variable-tracking questions
(``ruler_vt``) the variables the chain of assignments gives the value.
``prompt_logprobs`` (the teacher-forced pass) are vLLM's shape: per prompt
position the top-k tokens and the actual one, with log-probs that depend on
the token and its position alone.

PROTOCOL_SERVER_RECALLS=POOL:TOKENS makes the server of that pool (as
``log_startup`` names it: stock, fp8, bf16 or mixed) answer pass-code and
RULER questions wrongly in prompts longer than TOKENS, and score every prompt
token past position TOKENS half a nat lower: a model whose long-context
retrieval fails past some length, for the report to catch.

The log lines the launch scripts confirm are printed as vLLM and this plugin
print them, for the pool the flags and ``VLLM_PLUGINS`` make.
"""

import argparse
import hashlib
import os
import re
import sys
from collections.abc import Iterator
from typing import Any

PLUGIN_LINES = (
    "vllm-minimax-m3-kv active: minimax_m3_config_hook, "
    "minimax_m3_indexer_cache_storage, minimax_m3_rocm_fp8_triton_indexer, "
    "minimax_m3_rocm_fnuz_index_writer, minimax_m3_rocm_fp8_balanced_decode, "
    "minimax_m3_kv_zeroing_decision, "
    "minimax_m3_kv_allow_mixed_env"
)


PASS_CODE_QUESTION = re.compile(r"what is the pass code for vault (\S+)\?")
RECALLS_ENV = "PROTOCOL_SERVER_RECALLS"


def pool_of(flags: argparse.Namespace) -> str:
    """The pool these flags and VLLM_PLUGINS make, as the launch scripts name it."""
    listed = os.environ.get("VLLM_PLUGINS")
    if listed is not None and "minimax_m3_kv" not in listed.split(","):
        return "stock"
    if os.environ.get("VLLM_MINIMAX_M3_KV_ALLOW_MIXED") == "1":
        return "mixed"
    return "fp8" if flags.kv_cache_dtype == "fp8" else "bf16"


def recall_limit(pool: str) -> int | None:
    """Prompt tokens past which this pool's server answers pass codes wrongly."""
    setting = os.environ.get(RECALLS_ENV, "")
    name, _, tokens = setting.partition(":")
    return int(tokens) if setting and name == pool else None


def pass_code_answer(
    prompt: str, prompt_tokens: int, recalls: int | None
) -> str | None:
    """The answer to a pass-code question: the code the prompt gives for the
    asked vault (digits reversed past the recall limit), or None if not asked."""
    asked = PASS_CODE_QUESTION.search(prompt[-200:])
    if asked is None:
        return None
    key = re.escape(asked.group(1))
    given = re.search(rf"The pass code for vault {key} is ([0-9]{{6}})\.", prompt)
    code = given.group(1) if given else "000000"
    if recalls is not None and prompt_tokens > recalls:
        code = str(999_999 - int(code)).zfill(6)
    return f" {code}"


RULER_NEEDLE_PREFIX = re.compile(
    r"The special magic (\w+?)s? for (.+?) mentioned in the provided text (?:is|are)\s*$"
)
RULER_VT_QUESTION = re.compile(r"variables are assigned the value (\d+), they are:\s*$")
LOST_NATS = 0.5


def ruler_answer(prompt: str, prompt_tokens: int, recalls: int | None) -> str | None:
    """The answer to a RULER needle or variable-tracking question at the end
    of ``prompt`` (wrong past the recall limit), or None if none is asked."""
    wrong = recalls is not None and prompt_tokens > recalls
    asked = RULER_NEEDLE_PREFIX.search(prompt[-400:])
    if asked is not None:
        kind, key = asked.group(1), re.escape(asked.group(2))
        values = re.findall(
            rf"One of the special magic {kind}s? for {key} is: (\S+?)\.(?:\s|$)",
            prompt,
        )
        if wrong:
            values = [value[::-1] + "0" for value in values]
        return " " + ", ".join(values) + "."
    asked = RULER_VT_QUESTION.search(prompt[-400:])
    if asked is not None:
        value = asked.group(1)
        found = set(re.findall(rf"VAR (\w+) = {value}\b", prompt))
        links = re.findall(r"VAR (\w+) = VAR (\w+)", prompt)
        grew = True
        while grew:
            before = len(found)
            found |= {left for left, right in links if right in found}
            grew = len(found) > before
        names = sorted(found)
        return " " + " ".join(names[:-1] if wrong else names)
    return None


def prompt_logprob(token: int, position: int, lost: bool) -> float:
    """The log-prob this server gives a prompt token at its position."""
    return -0.2 - (_digest(token, position) % 50) / 100 - (LOST_NATS if lost else 0.0)


def _digest(*parts: object) -> int:
    return int(hashlib.sha256(repr(parts).encode()).hexdigest()[:8], 16)


def log_startup(flags: argparse.Namespace) -> None:
    """What vLLM's log holds for this pool (read by the launch scripts)."""
    plugin = pool_of(flags) != "stock"
    if plugin:
        print(f"(APIServer pid=1) INFO [__init__.py:46] {PLUGIN_LINES}", flush=True)
    fp8 = flags.kv_cache_dtype == "fp8"
    print(
        "(EngineCore pid=2) INFO [kv_cache_utils.py:1147] GPU KV cache size: "
        f"{3_033_088 if fp8 else 2_294_272:,} tokens, Maximum concurrency for "
        "8,192 tokens per request: 280.06x",
        flush=True,
    )
    if not plugin:
        return
    if os.environ.get("VLLM_MINIMAX_M3_KV_ALLOW_MIXED") == "1":
        print(
            "(EngineCore pid=2) WARNING [kv_cache_zeroing.py:82] MiniMax-M3 KV pool: "
            "mixed precision (bfloat16/NONE, uint8/FP8_PER_TENSOR); every one of 8 "
            "workers and the scheduler zero newly allocated blocks.",
            flush=True,
        )
        return
    precision = "uint8/FP8_PER_TENSOR" if fp8 else "bfloat16/NONE"
    print(
        "(EngineCore pid=2) INFO [kv_cache_zeroing.py:76] MiniMax-M3 KV pool: one "
        f"precision ({precision}) on all 8 workers; no KV block zeroer is built.",
        flush=True,
    )


def make_app(
    model: str, served_name: str, max_model_len: int, recalls: int | None = None
) -> Any:
    from fastapi import FastAPI, Request
    from fastapi.responses import JSONResponse, StreamingResponse
    from pydantic import ValidationError
    from transformers import AutoTokenizer
    from vllm.entrypoints.openai.completion.protocol import (
        CompletionLogProbs,
        CompletionRequest,
        CompletionResponse,
        CompletionResponseChoice,
        CompletionResponseStreamChoice,
        CompletionStreamResponse,
    )
    from vllm.entrypoints.serve.engine.protocol import ModelCard, ModelList, UsageInfo
    from vllm.entrypoints.serve.tokenize.protocol import (
        TokenizeCompletionRequest,
        TokenizeResponse,
    )
    from vllm.logprobs import Logprob

    tokenizer = AutoTokenizer.from_pretrained(model)
    vocab = len(tokenizer)
    app = FastAPI()

    def error(message: str, status: int = 400) -> JSONResponse:
        # vLLM's ErrorResponse shape.
        body = {
            "error": {"message": message, "type": "BadRequestError", "code": status}
        }
        return JSONResponse(body, status_code=status)

    def generate(prompt: str, prompt_tokens: int, count: int) -> list[int]:
        ruler = ruler_answer(prompt, prompt_tokens, recalls)
        if ruler is not None:
            ids = tokenizer.encode(ruler, add_special_tokens=False)
            return (ids + [tokenizer.eos_token_id or 0] * count)[:count]
        if prompt.rstrip().endswith("Answer:"):
            answer = pass_code_answer(prompt, prompt_tokens, recalls)
            if answer is None:
                answer = f" #### {_digest(prompt) % 10}"
            ids = tokenizer.encode(answer, add_special_tokens=False)
            return (ids + [tokenizer.eos_token_id or 0] * count)[:count]
        return [_digest(prompt, i) % vocab for i in range(count)]

    def logprobs_of(ids: list[int], top: int) -> CompletionLogProbs:
        tokens = [tokenizer.decode([i]) for i in ids]
        tops = []
        for position, token in enumerate(tokens):
            others = {
                tokenizer.decode([(_digest(position, k) % vocab)]): -2.0 - k
                for k in range(top - 1)
            }
            tops.append({**others, token: -0.1})
        return CompletionLogProbs(
            tokens=tokens,
            token_logprobs=[-0.1] * len(tokens),
            top_logprobs=tops,
            text_offset=list(range(len(tokens))),
        )

    def prompt_logprobs_of(ids: list[int], top: int) -> list[dict | None]:
        # vLLM's shape: None for the first token; then the top-k tokens by
        # rank and the actual token, with its own rank, if not among them.
        found: list[dict | None] = [None]
        for position in range(1, len(ids)):
            actual = prompt_logprob(
                ids[position], position, recalls is not None and position > recalls
            )
            others = {
                _digest("alt", position, k) % vocab: actual - 0.3 * (k + 1)
                for k in range(top)
            }
            others.pop(ids[position], None)
            ranked = sorted(
                [(ids[position], actual), *others.items()], key=lambda t: -t[1]
            )
            found.append(
                {
                    token: Logprob(logprob, rank, tokenizer.decode([token]))
                    for rank, (token, logprob) in enumerate(ranked, start=1)
                    if rank <= top or token == ids[position]
                }
            )
        return found

    @app.get("/health")
    async def health() -> JSONResponse:
        return JSONResponse({})

    @app.get("/v1/models")
    async def models() -> JSONResponse:
        card = ModelCard(id=served_name, root=model, max_model_len=max_model_len)
        return JSONResponse(ModelList(data=[card]).model_dump())

    @app.post("/tokenize")
    async def tokenize(raw: Request) -> JSONResponse:
        try:
            request = TokenizeCompletionRequest.model_validate(await raw.json())
        except ValidationError as invalid:
            return error(str(invalid))
        ids = tokenizer.encode(
            request.prompt, add_special_tokens=request.add_special_tokens
        )
        reply = TokenizeResponse(
            count=len(ids), max_model_len=max_model_len, tokens=ids
        )
        return JSONResponse(reply.model_dump())

    @app.post("/v1/completions")
    async def completions(raw: Request) -> Any:
        try:
            request = CompletionRequest.model_validate(await raw.json())
        except ValidationError as invalid:
            return error(str(invalid))
        prompt = request.prompt
        if not isinstance(prompt, str):
            return error("this test server takes one text prompt per request")
        prompt_ids = tokenizer.encode(prompt)
        wanted = request.max_tokens or 16
        if len(prompt_ids) + wanted > max_model_len:
            return error(
                f"This model's maximum context length is {max_model_len} tokens. "
                f"However, you requested {len(prompt_ids) + wanted} tokens "
                f"({len(prompt_ids)} in the messages, {wanted} in the completion)."
            )
        ids = generate(prompt, len(prompt_ids), wanted)
        usage = UsageInfo(
            prompt_tokens=len(prompt_ids),
            completion_tokens=len(ids),
            total_tokens=len(prompt_ids) + len(ids),
        )
        top = request.logprobs
        if not request.stream:
            choice = CompletionResponseChoice(
                index=0,
                text=tokenizer.decode(ids),
                logprobs=None if top is None else logprobs_of(ids, max(top, 1)),
                finish_reason="length",
                prompt_logprobs=None
                if request.prompt_logprobs is None
                else prompt_logprobs_of(prompt_ids, request.prompt_logprobs),
            )
            reply = CompletionResponse(model=served_name, choices=[choice], usage=usage)
            return JSONResponse(reply.model_dump())

        def events() -> Iterator[str]:
            for position, token in enumerate(ids):
                choice = CompletionResponseStreamChoice(
                    index=0,
                    text=tokenizer.decode([token]),
                    finish_reason="length" if position == len(ids) - 1 else None,
                )
                chunk = CompletionStreamResponse(model=served_name, choices=[choice])
                yield f"data: {chunk.model_dump_json(exclude_unset=True)}\n\n"
            options = request.stream_options
            if options is not None and options.include_usage:
                final = CompletionStreamResponse(
                    model=served_name, choices=[], usage=usage
                )
                yield f"data: {final.model_dump_json(exclude_unset=True)}\n\n"
            yield "data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    return app


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("command", choices=["serve"])
    parser.add_argument("model")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--max-model-len", type=int, default=8192)
    parser.add_argument("--kv-cache-dtype", default="auto")
    parser.add_argument("--served-model-name")
    flags, _ = parser.parse_known_args(argv)
    pidfile = os.environ.get("STANDIN_PIDFILE")
    if pidfile:
        with open(pidfile, "a") as pids:
            pids.write(f"{os.getpid()}\n")
    app = make_app(
        flags.model,
        flags.served_model_name or flags.model,
        flags.max_model_len,
        recall_limit(pool_of(flags)),
    )
    log_startup(flags)
    import uvicorn

    uvicorn.run(app, host="127.0.0.1", port=flags.port, log_level="warning")


if __name__ == "__main__":
    main(sys.argv[1:])
