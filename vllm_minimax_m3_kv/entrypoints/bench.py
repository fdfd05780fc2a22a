"""``vllm-minimax-m3-kv bench``: vLLM's MiniMax-M3 decode index scorer on this
GPU, fp8 vs bf16 index cache, timed as serving runs it.

Times ``minimax_m3_index_decode`` as vLLM's indexer module imports it on this
platform (on ROCm ``models/minimax_m3/amd/ops/index_topk.py``), on a bf16 and
an fp8 index cache holding the same values, in the fp8 type serving stores
(e4m3fnuz on gfx942, e4m3fn elsewhere), per batch (1-64), context (8K-128K)
and query length (1, and 2 for MTP verification), one index head (TP 4 and 8).

As serving runs it: the top-k buffer and, on ROCm, the completion counter are
allocated once (as under CUDA graphs), and each launch starts from a cold cache
(512 MiB written between launches, past MI300X's and MI355X's 256 MiB Infinity
Cache), so each dtype's index-K bytes come from HBM.

vLLM's launch policy picks the scorer's configuration per dtype: on gfx950 a
tuned "balanced" kernel for bf16 at 1-11 requests and a high-batch split at
20-64, split-K for fp8. Each row therefore has two ratios: the dtypes at the
same launch configuration (bf16 launched as vLLM launches fp8: the bytes
alone), and each at its own (what serving runs today); where the policies
differ, fp8 launched as vLLM launches bf16 too (would the tuned launches pay
for fp8: ``VLLM_MINIMAX_M3_KV_FP8_BALANCED_DECODE`` offers the balanced one).
On gfx942 one more row times the plugin's fnuz writer kernel per sparse layer
(one of its two extra launches; vLLM's cache-free fused call is the other).

``--plan`` prints what would be timed, with vLLM's launch configuration for
each arm (asked of vLLM's own policy functions), and checks it; it runs
anywhere, for this node or for ``--target T`` (no GPU needed). Ratios come
from one run on one GPU. Without a GPU nothing is timed: exit 2.

Each launch is queued behind a ~1 ms GPU wait, so the events time the kernels,
not Python's launch cost (CUDA graphs hide it in serving).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import importlib
import inspect
import json
import statistics
import sys
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from vllm_minimax_m3_kv.config.targets import HERE, TARGET_PLATFORMS, TARGETS
from vllm_minimax_m3_kv.entrypoints.output import (
    Output,
    add_output_flags,
    markdown_table,
)

BATCHES = (1, 4, 8, 16, 32, 64)
CONTEXTS = (8 * 1024, 64 * 1024, 128 * 1024)
QUERY_SHAPES = ((1, 1), (2, 2))
"""(query length, configured maximum): plain decode, MTP verification."""
QUICK = {"batches": (1, 32), "contexts": (8 * 1024,), "query_shapes": QUERY_SHAPES}
BLOCK = 128
INDEX_DIM = 128
TOPK = 16
INDEX_HEADS = 1
FLUSH_BYTES = 512 << 20
LAUNCH_COVER_CYCLES = 2_000_000
"""About 1 ms of GPU clock: longer than the host takes to queue one decode."""
LAST_LEVEL_CACHE_BYTES = 256 << 20
"""The largest last-level cache among the GPUs served (MI300X, MI355X)."""
NO_GPU = (
    "no GPU in this process: nothing timed (run it on the serving node, where "
    "vLLM and its kernels are installed); --plan shows what it would time"
)
EXIT_TIMED, EXIT_PLAN_WRONG, EXIT_NOT_RUN = 0, 1, 2
"""Timed (``--plan``: the plan checks); the plan is wrong; nothing timed."""
OPS_MODULES = {
    "rocm": "vllm.models.minimax_m3.amd.ops.index_topk",
    "cuda": "vllm.models.minimax_m3.common.ops.index_topk",
}
"""The scorers vLLM's indexer module imports on each vendor."""


@dataclass(frozen=True)
class Arm:
    """One timed launch: the cache's dtype, and the dtype vLLM's launch
    policy is asked about (the configuration it launches with)."""

    name: str
    dtype: str
    launch_as: str
    launch: str = ""
    """vLLM's configuration for ``launch_as`` (``balanced x1024``, ...)."""


@dataclass
class Row:
    batch: int
    context: int
    query_len: int
    max_query_len: int
    arms: list[Arm] = field(default_factory=list)
    index_k_bytes: dict[str, int] = field(default_factory=dict)
    """Index-K bytes one launch reads, per dtype."""


def _platform(target: str = HERE) -> dict[str, Any]:
    """The scorers, launch policy and fp8 type of this node, or of a named
    target (its vendor's scorer module, its arch and fp8 flavour)."""
    import torch

    if target == HERE:
        from vllm.models.minimax_m3.common import indexer as vllm_indexer
        from vllm.platforms import current_platform

        from vllm_minimax_m3_kv.selftest import platform_fp8

        ops = sys.modules[vllm_indexer.minimax_m3_index_decode.__module__]
        rocm, name, fp8_indexer = current_platform.is_rocm(), "this node", True
        gfx950 = rocm and importlib.import_module("vllm.platforms.rocm").on_gfx950()
        fnuz = platform_fp8().dtype == "float8_e4m3fnuz"
    else:
        facts = TARGET_PLATFORMS[target]
        ops = importlib.import_module(OPS_MODULES[facts["vendor"]])
        rocm, name = facts["vendor"] == "rocm", facts["name"]
        gfx950, fnuz = bool(facts.get("rocm_gfx950")), bool(facts.get("fp8_fnuz"))
        fp8_indexer = bool(
            gfx950 or facts.get("rocm_gfx942") or facts.get("cuda_supports_fp8")
        )
    fp8 = torch.float8_e4m3fnuz if fnuz else torch.float8_e4m3fn
    return {
        "ops": ops,
        "decode": ops.minimax_m3_index_decode,
        "gfx950": bool(gfx950),
        "rocm": rocm,
        "fnuz": fnuz,
        "fp8_indexer": fp8_indexer,
        "name": name,
        "dtypes": {"bf16": torch.bfloat16, "fp8": fp8},
    }


def launch_config(platform: dict[str, Any], batch: int, dtype: str) -> str:
    """vLLM's decode-score launch for ``batch`` requests of ``dtype``, as its
    own policy functions answer (ROCm); CUDA has one launch."""
    ops = platform["ops"]
    if not hasattr(ops, "_decode_score_program_budget"):
        return "vLLM's CUDA launch"
    torch_dtype = platform["dtypes"][dtype]
    args = (batch, INDEX_DIM, torch_dtype, torch_dtype)
    budget = ops._decode_score_program_budget(*args, is_gfx950=platform["gfx950"])
    if budget is not None:
        return f"balanced x{budget}"
    chunks, high_batch = ops._decode_score_split_launch_policy(
        *args, is_gfx950=platform["gfx950"]
    )
    return f"split-K x{chunks}" + (" high-batch" if high_batch else "")


def plan(platform: dict[str, Any], quick: bool = False) -> list[Row]:
    batches = QUICK["batches"] if quick else BATCHES
    contexts = QUICK["contexts"] if quick else CONTEXTS
    shapes = QUICK["query_shapes"] if quick else QUERY_SHAPES
    rows = []
    for batch in batches:
        launch = {d: launch_config(platform, batch, d) for d in ("bf16", "fp8")}
        for context in contexts:
            for query_len, max_query_len in shapes:
                row = Row(batch, context, query_len, max_query_len)
                row.arms = [
                    Arm("bf16", "bf16", "bf16", launch["bf16"]),
                    Arm("fp8", "fp8", "fp8", launch["fp8"]),
                ]
                if launch["bf16"] != launch["fp8"]:
                    row.arms += [
                        Arm("bf16 at fp8's launch", "bf16", "fp8", launch["fp8"]),
                        Arm("fp8 at bf16's launch", "fp8", "bf16", launch["bf16"]),
                    ]
                row.index_k_bytes = {
                    dtype: batch * context * INDEX_DIM * size
                    for dtype, size in (("bf16", 2), ("fp8", 1))
                }
                rows.append(row)
    return rows


def check_plan(platform: dict[str, Any], rows: list[Row]) -> list[str]:
    """What a plan must hold to measure what serving runs; empty if it does."""
    problems = []
    if not platform["fp8_indexer"]:
        problems.append(f"{platform['name']} serves no fp8 index cache")
    fp8 = platform["dtypes"]["fp8"]
    if platform["fnuz"] != (str(fp8) == "torch.float8_e4m3fnuz"):
        problems.append(f"fp8 arm stores {fp8}, not the type serving stores")
    if FLUSH_BYTES <= LAST_LEVEL_CACHE_BYTES:
        problems.append("the flush does not exceed the last-level cache")
    for row in rows:
        arms = {arm.name: arm for arm in row.arms}
        same = arms.get("bf16 at fp8's launch", arms["bf16"])
        if same.launch != arms["fp8"].launch:
            problems.append(f"batch {row.batch}: no same-launch bf16 arm")
    if not any(row.query_len == 2 for row in rows):
        problems.append("no MTP (query length 2) row")
    return problems


@contextlib.contextmanager
def launch_as(ops: Any, dtype: Any) -> Iterator[None]:
    """vLLM's ROCm launch policy asked about ``dtype`` whatever the cache's:
    the kernel runs on the real dtypes with that dtype's configuration."""
    names = ("_decode_score_program_budget", "_decode_score_split_launch_policy")
    saved = {name: getattr(ops, name, None) for name in names}
    for name, policy in saved.items():
        if policy is None:
            continue

        def asked_as(num_reqs, head_dim, query_dtype, cache_dtype, *, policy=policy,
                     **kwargs):  # fmt: skip
            return policy(num_reqs, head_dim, dtype, dtype, **kwargs)

        setattr(ops, name, asked_as)
    try:
        yield
    finally:
        for name, policy in saved.items():
            if policy is not None:
                setattr(ops, name, policy)


@contextlib.contextmanager
def _balanced_for_fp8(ops: Any) -> Iterator[None]:
    """vLLM's ROCm policy offering the balanced kernel to an fp8 cache and
    query too: the plugin's VLLM_MINIMAX_M3_KV_FP8_BALANCED_DECODE=1."""
    from vllm_minimax_m3_kv.model_executor.models.minimax_m3_rocm_fp8_triton_indexer import (
        wrap_decode_score_program_budget,
    )

    budget = ops._decode_score_program_budget
    ops._decode_score_program_budget = wrap_decode_score_program_budget(
        budget, enabled=True
    )
    try:
        yield
    finally:
        ops._decode_score_program_budget = budget


def _time(run: Any, flush: Any, iters: int) -> float:
    """Median microseconds of ``run``, each launch from a cold cache."""
    import torch

    for _ in range(3):
        run()
    samples = []
    for _ in range(iters):
        flush.zero_()
        # The GPU waits here while the host queues the launches behind it, so
        # the events time the kernels, not Python's launch cost (on an H200
        # without it every row under about 100 MiB read timed 160 us).
        torch.cuda._sleep(LAUNCH_COVER_CYCLES)
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        run()
        end.record()
        torch.cuda.synchronize()
        samples.append(start.elapsed_time(end) * 1000.0)
    return statistics.median(samples)


def _inputs(row: Row, platform: dict[str, Any]) -> dict[str, Any]:
    """The same values in both dtypes, made on the GPU (the largest rows
    hold gigabytes)."""
    import torch

    from vllm_minimax_m3_kv.selftest import E4M3FN, E4M3FNUZ, e4m3

    fmt = E4M3FNUZ if platform["fnuz"] else E4M3FN
    blocks = row.context // BLOCK
    generator = torch.Generator(device="cuda").manual_seed(0)
    shape = (row.batch * blocks, BLOCK, INDEX_DIM)
    keys = e4m3(torch.randn(shape, generator=generator, device="cuda"), fmt)
    queries = e4m3(
        torch.randn(row.batch * row.query_len, INDEX_HEADS, INDEX_DIM,
                    generator=generator, device="cuda"),
        fmt,
    )  # fmt: skip
    i32 = {"dtype": torch.int32, "device": "cuda"}
    return {
        "caches": {
            "fp8": (keys, queries),
            "bf16": (keys.to(torch.bfloat16), queries.to(torch.bfloat16)),
        },
        "table": torch.arange(row.batch * blocks, **i32).view(row.batch, blocks),
        "lens": torch.full((row.batch,), row.context, **i32),
    }


def measure(
    iters: int, quick: bool, progress: Callable[[str], None] | None = None
) -> dict[str, Any]:
    import torch

    platform = _platform()
    decode, ops = platform["decode"], platform["ops"]
    takes_counter = "completion_counter" in inspect.signature(decode).parameters
    flush = torch.empty(FLUSH_BYTES, dtype=torch.uint8, device="cuda")
    rows = plan(platform, quick)
    report_rows = []
    for row in rows:
        data = _inputs(row, platform)
        total_q = row.batch * row.query_len
        out = torch.empty(INDEX_HEADS, total_q, TOPK, dtype=torch.int32, device="cuda")
        extra = {"out": out}
        if takes_counter:
            extra["completion_counter"] = torch.zeros(
                INDEX_HEADS, total_q, dtype=torch.int32, device="cuda"
            )
        timed = {}
        for arm in row.arms:
            cache, query = data["caches"][arm.dtype]

            run = functools.partial(
                decode, query, cache, data["table"], data["lens"], row.context,
                TOPK, 0, 1, INDEX_HEADS, row.query_len, row.max_query_len, **extra,
            )  # fmt: skip
            with launch_as(ops, platform["dtypes"][arm.launch_as]):
                timed[arm.name] = _time(run, flush, iters)
        report_rows.append({**asdict(row), "us": timed})
        # Progress, so a run cut short still shows the rows it measured.
        if progress is not None:
            progress(f"bench: {asdict(row)} {timed}")
    report = {
        "gpu": torch.cuda.get_device_name(),
        "fp8": str(platform["dtypes"]["fp8"]),
        "iters": iters,
        "rows": report_rows,
    }
    if platform["fnuz"]:
        report["writer"] = _time_writer(flush, iters)
    return report


def _time_writer(flush: Any, iters: int) -> list[dict[str, Any]]:
    """The plugin's fnuz writer kernel for one sparse layer and step."""
    import torch

    from vllm_minimax_m3_kv.model_executor.models.minimax_m3_rocm_fnuz_index_writer import (
        FNUZ,
        clamp_cast_index,
        fnuz_max,
    )

    timings = []
    for tokens in (1, 32, 64, 8192):
        key = torch.randn(tokens, INDEX_DIM, device="cuda", dtype=torch.bfloat16)
        query = torch.randn(tokens, INDEX_DIM, device="cuda", dtype=torch.bfloat16)
        cache = torch.empty(tokens // BLOCK + 1, BLOCK, INDEX_DIM, dtype=FNUZ,
                            device="cuda")  # fmt: skip
        query_out = torch.empty(tokens, INDEX_DIM, dtype=FNUZ, device="cuda")
        slots = torch.arange(tokens, device="cuda")

        def run(key=key, query=query, cache=cache, query_out=query_out, slots=slots):
            clamp_cast_index(key, query, cache, query_out, slots, fnuz_max())

        timings.append({"tokens": tokens, "us": _time(run, flush, iters)})
    return timings


def render_plan(platform: dict[str, Any], rows: list[Row]) -> str:
    body = [
        [
            row.batch,
            f"{row.context:,}",
            f"{row.query_len} of {row.max_query_len}",
            "; ".join(f"{arm.name}: {arm.launch}" for arm in row.arms),
        ]
        for row in rows
    ]
    head = (
        f"Would time vLLM's decode index scorer, bf16 vs "
        f"{str(platform['dtypes']['fp8']).removeprefix('torch.')}, one index head, "
        f"{FLUSH_BYTES >> 20} MiB written between launches, no per-step memset"
    )
    if platform["fnuz"]:
        head += "; plus the plugin's fnuz writer kernel per sparse layer"
    return "\n\n".join(
        [head, markdown_table(["batch", "context", "query", "arms (launch)"], body)]
    )


def render(report: dict[str, Any]) -> str:
    headers = ["batch", "context", "query", "bf16 us", "fp8 us", "fp8 / bf16",
               "same launch: fp8 / bf16", "fp8 at bf16's launch / bf16"]  # fmt: skip
    body = []
    for row in report["rows"]:
        us = row["us"]
        same = us.get("bf16 at fp8's launch", us["bf16"])
        tuned = us.get("fp8 at bf16's launch")
        body.append(
            [
                row["batch"],
                f"{row['context']:,}",
                f"{row['query_len']} of {row['max_query_len']}",
                f"{us['bf16']:.1f}",
                f"{us['fp8']:.1f}",
                f"{us['fp8'] / us['bf16']:.2f}x",
                f"{us['fp8'] / same:.2f}x",
                f"{tuned / us['bf16']:.2f}x" if tuned else "same launch",
            ]
        )
    parts = [
        f"vLLM's decode index scorer on {report['gpu']}, bf16 vs {report['fp8']}, "
        f"median of {report['iters']} launches from a cold cache, one index head",
        markdown_table(headers, body),
    ]
    if "writer" in report:
        parts.append(
            "The plugin's fnuz writer kernel, one sparse layer and step: "
            + ", ".join(
                f"{w['tokens']} tokens {w['us']:.1f} us" for w in report["writer"]
            )
        )
    return "\n\n".join(parts)


def build_parser() -> argparse.ArgumentParser:
    """``bench``'s flags (the docs' commands are checked against it)."""
    from vllm_minimax_m3_kv._versions import DISTRIBUTION

    parser = argparse.ArgumentParser(
        prog=f"{DISTRIBUTION} bench",
        description="Time vLLM's MiniMax-M3 decode index scorer on this GPU, "
        "bf16 vs fp8 index cache, at vLLM's own launch policy for this node (and "
        "fp8 at bf16's launch), batches 1-64, contexts 8K-128K, query length 1 "
        "and 2, each launch from a cold cache; prints the ratios of one run. "
        f"Exit {EXIT_TIMED}: timed (--plan: the plan checks); {EXIT_PLAN_WRONG}: "
        f"the plan does not measure what serving runs; {EXIT_NOT_RUN}: no GPU, "
        "nothing timed.",
    )
    parser.add_argument(
        "--plan", action="store_true", help="print and check the plan; time nothing"
    )
    parser.add_argument(
        "--target",
        type=str.lower,
        choices=[*TARGETS, HERE],
        default=HERE,
        help="with --plan: the GPU to plan for (default: this node)",
    )
    parser.add_argument("--quick", action="store_true", help="two batches, one context")
    parser.add_argument("--iters", type=int, default=50, help="timed launches per arm")
    parser.add_argument(
        "--render",
        type=Path,
        metavar="JSON",
        help="print the table of a saved run (this command's --json output, or "
        "the device check's device_check.json) instead of running",
    )
    add_output_flags(parser)
    return parser


def main(argv: list[str] | None = None) -> int:
    """``vllm-minimax-m3-kv bench``; its exit code."""
    from vllm_minimax_m3_kv._versions import DISTRIBUTION

    parser = build_parser()
    options = parser.parse_args(argv)
    out = Output.asked_by(options)
    if options.render is not None:
        saved = json.loads(options.render.read_text(encoding="utf-8"))
        saved = saved.get("decode_scorer", saved)
        out.answer(render(saved), saved)
        return EXIT_TIMED
    if options.target != HERE and not options.plan:
        out.problem(
            f"{DISTRIBUTION} bench: --target {options.target} plans only "
            f"(add --plan); timing runs on the node itself"
        )
        return EXIT_PLAN_WRONG
    import torch

    gpu = torch.cuda.is_available()
    if options.plan or not gpu:
        platform = _platform(options.target)
        rows = plan(platform, options.quick)
        problems = check_plan(platform, rows)
        code = EXIT_PLAN_WRONG if problems else EXIT_TIMED
        if not options.plan:
            code = EXIT_NOT_RUN
            out.problem(NO_GPU)
        out.answer(
            render_plan(platform, rows)
            + "\n"
            + ("\n".join(problems) or "plan checked"),
            {
                "exit": code,
                "target": options.target,
                "gpu": gpu,
                "fp8": str(platform["dtypes"]["fp8"]),
                "writer_row": platform["fnuz"],
                "rows": [asdict(row) for row in rows],
                "problems": problems,
                "timed": False,
            },
        )
        return code
    report = measure(options.iters, options.quick, progress=out.problem)
    out.answer(render(report), {"exit": EXIT_TIMED, "timed": True, **report})
    return EXIT_TIMED
