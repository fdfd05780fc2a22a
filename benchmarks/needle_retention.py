"""Needle retention: what an fp8 index cache does to the block choice around a
needle, paired against bf16 over enough haystacks to see a small effect.

``python -m benchmarks.needle_retention [--quick] [--json] [--haystacks N]
[--direct JSON --lengths L] [--render JSON]``

The long-context eval asks for one fact among filler; the index cache decides
whether the block holding it is read. Here: a haystack of RMS-normed random
index keys, the queries leaning towards one direction, and one key of one
block (the needle, its depth cycling from the first block to the last over
the haystacks) along it. vLLM's scorers, as its indexer module imports them
on the path, pick the top-16 blocks for prefill (the last 4 tokens) and
decode (one request, query lengths 1 and 2): 7 choices per haystack.

Each arm stores the same keys and queries differently and is compared with
bf16 (what vLLM 0.33 stores today) on the same haystacks and choices,
paired: choices that lost the needle bf16 kept, choices that gained it, and
the change in retention in points with a 95% interval from resampling
haystacks (a haystack's 7 choices are correlated, so they move together).

- ``fp8``: both in the platform's e4m3 (vLLM's contract: the model allocates
  its index query in the cache's dtype);
- ``fp32``: a null arm (finer than bf16; on an NVIDIA GPU ``tl.dot`` reads
  fp32 as TF32);
- ``fp8-sized noise``: a null arm: each value times one plus a relative fp8
  rounding error drawn from another element (fp8's error size, not its
  pattern), stored as fp32.

Needles: ``clear`` (three times the direction, as the node self-test plants
it), ``faint`` (0.3 times: its block's score sits near the 16th best, so
the choice is close by construction) and ``faint, RMS-normed`` (the same
expected score from a key as large as every other key: the model's index
keys are normed). Per needle and length the fp64 columns say how close the
choice is: the share of choices exact arithmetic on the unstored values
keeps, and the needle's median margin over the cut (its score minus the
score it must beat).

Synthetic keys, not a checkpoint's: a prediction to read beside the
long-context eval on the GPUs, not accuracy. On a CPU, Triton's interpreter
runs 4K (``--quick``: 3 haystacks, one path); on a CUDA GPU, vLLM's CUDA
scorers at 16K, 64K and 128K. ``--render`` prints a saved run's table.
"""

from __future__ import annotations

import json
import math
import random
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from benchmarks._common import run_child, sweep_main, sweep_parser, table

PATHS = {
    "CUDA Triton (H200)": "h200",
    "ROCm Triton gfx950 (MI355X)": "mi355x",
    "ROCm Triton gfx942 (MI300X)": "mi300x",
}
QUICK_PATHS = ("ROCm Triton gfx950 (MI355X)",)
CPU_LENGTHS = (4_096,)
GPU_LENGTHS = (16_384, 65_536, 131_072)
HAYSTACKS = {"quick": 3, "full": 20, "gpu": 200}
ARMS = ("fp8", "fp32", "fp8-sized noise")
REFERENCE_ARM = "bf16"
DEPTHS = 5
NEEDLE_TOKEN = 37
FAINT = 0.3
RMS_NORMED_WEIGHT = FAINT / math.sqrt(1 - FAINT**2)
"""rms(w*d + r) with d, r RMS-normed and independent is sqrt(1 + w^2): this w
gives the normed needle the faint one's expected score."""
NEEDLES = ("clear", "faint", "faint, RMS-normed")
OUTPUTS = ("prefill_topk", "decode_topk_q1", "decode_topk_q2")
BOOTSTRAP_REPS = 2000


# -- statistics (pure: the fast tier tests them) ------------------------------


def paired_change(
    arm: list[list[bool]], reference: list[list[bool]], seed: int = 0
) -> dict[str, Any]:
    """``arm`` against ``reference`` on the same choices, grouped by
    haystack: choices lost and gained, the change in retention in points, and
    its 95% interval from resampling haystacks (percentile bootstrap)."""
    if len(arm) != len(reference) or not arm:
        raise ValueError("need the same haystacks, at least one, in both arms")
    diffs, sizes, lost, gained = [], [], 0, 0
    for ours, theirs in zip(arm, reference, strict=True):
        if len(ours) != len(theirs):
            raise ValueError("a haystack has different choices in the two arms")
        lost += sum(t and not o for o, t in zip(ours, theirs, strict=True))
        gained += sum(o and not t for o, t in zip(ours, theirs, strict=True))
        diffs.append(sum(ours) - sum(theirs))
        sizes.append(len(ours))
    rows = sum(sizes)
    draw = random.Random(seed)
    haystacks = range(len(arm))
    resampled = []
    for _ in range(BOOTSTRAP_REPS):
        picks = draw.choices(haystacks, k=len(arm))
        resampled.append(
            100.0 * sum(diffs[i] for i in picks) / sum(sizes[i] for i in picks)
        )
    resampled.sort()
    return {
        "haystacks": len(arm),
        "rows": rows,
        "kept": sum(map(sum, arm)),
        "kept_reference": sum(map(sum, reference)),
        "lost": lost,
        "gained": gained,
        "change_points": 100.0 * sum(diffs) / rows,
        "interval": [
            resampled[int(0.025 * BOOTSTRAP_REPS)],
            resampled[int(0.975 * BOOTSTRAP_REPS) - 1],
        ],
    }


def fp64_margin(
    scores: list[float], needle: int, position: int, topk: int, local_blocks: int
) -> float:
    """The needle block's fp64 score minus the score it must beat to be
    chosen under vLLM's rule (the query's last ``local_blocks`` forced in,
    then the best scores): positive where exact arithmetic keeps it; +inf
    where it is forced in or every visible block is chosen."""
    visible = position // 128 + 1
    forced = set(range(max(0, visible - local_blocks), visible))
    if needle in forced:
        return math.inf
    others = sorted(
        (scores[b] for b in range(visible) if b not in forced and b != needle),
        reverse=True,
    )
    room = topk - len(forced)
    if len(others) < room:
        return math.inf
    return scores[needle] - others[room - 1]


# -- the measurement (a child per path) ----------------------------------------


def _stored(values: Any, arm: str, fmt: Any, generator: Any) -> Any:
    import torch

    from vllm_minimax_m3_kv import selftest

    if arm == "fp8":
        return selftest.e4m3(values, fmt)
    if arm == "bf16":
        return values.to(torch.bfloat16)
    if arm == "fp32":
        return values.float()
    # fp8-sized noise: relative fp8 errors, each drawn from another element.
    relative = (selftest.e4m3(values, fmt).float() - values) / values
    relative = relative.flatten()[values.ne(0).flatten()]
    pick = torch.randint(
        relative.numel(), values.shape, generator=generator, device=values.device
    )
    return (values * (1 + relative[pick])).float()


def _haystack(length: int, index: int, device: str) -> tuple[Any, dict, int, Any]:
    """The self-test's synthetic request around one needle block, on
    ``device``: (case, inputs, the needle's block, the direction)."""
    from vllm_minimax_m3_kv import selftest

    blocks = length // selftest.SPARSE_BLOCK
    needle = round((index % DEPTHS) * (blocks - 1) / (DEPTHS - 1))
    case = selftest.Case.single(
        blocks=blocks,
        planted=(needle,),
        decode_requests=1,
        short_tail=0,
        seed=index,
    )
    inputs = selftest.make_inputs(case)  # plants 3 x the direction
    direction = inputs["keys"][needle * selftest.SPARSE_BLOCK + NEEDLE_TOKEN] / 3.0
    inputs = {name: value.to(device) for name, value in inputs.items()}
    return case, inputs, needle, direction.to(device)


def _needle_key(kind: str, direction: Any, index: int) -> Any:
    import torch

    if kind == "clear":
        return 3.0 * direction
    if kind == "faint":
        return FAINT * direction
    generator = torch.Generator().manual_seed(10_000 + index)
    noise = torch.randn(direction.numel(), generator=generator).to(direction.device)
    key = RMS_NORMED_WEIGHT * direction + noise / noise.pow(2).mean().sqrt()
    return key / key.pow(2).mean().sqrt()


def _fp64_scores(case: Any, inputs: dict[str, Any]) -> dict[str, Any]:
    """fp64 block scores per output, on the unstored values."""
    import torch

    keys = inputs["keys"].double()
    token = torch.arange(keys.shape[0], device=keys.device)
    scores = {}
    for output in OUTPUTS:
        positions = case.query_positions(output)
        queries = inputs["prefill_q" if output == "prefill_topk" else "decode_q"]
        dots = queries[: len(positions)].double() @ keys.T
        place = torch.tensor(positions, device=keys.device)
        dots = dots.masked_fill(token[None] > place[:, None], -math.inf)
        scores[output] = dots.view(len(positions), case.blocks, -1).amax(-1).cpu()
    return scores


def _length(length: int, haystacks: int, device: str) -> list[dict[str, Any]]:
    """Every needle and arm at one length, the haystacks shared."""
    import torch

    from vllm_minimax_m3_kv import selftest

    fmt = selftest.platform_fp8()
    arms = (REFERENCE_ARM, *ARMS)
    kept = {(kind, arm): [] for kind in NEEDLES for arm in arms}
    margins: dict[str, list[float]] = {kind: [] for kind in NEEDLES}
    for index in range(haystacks):
        case, inputs, needle, direction = _haystack(length, index, device)
        at = needle * selftest.SPARSE_BLOCK + NEEDLE_TOKEN
        for kind in NEEDLES:
            inputs["keys"][at] = _needle_key(kind, direction, index)
            generator = torch.Generator(device=device).manual_seed(20_000 + index)
            for arm in arms:
                stored = [_stored(v, arm, fmt, generator) for v in inputs.values()]
                with torch.device("cpu"):
                    outputs = selftest.run_scorers(case, *stored, device=device)
                kept[kind, arm].append(
                    [
                        needle in {int(b) for b in row.tolist()}
                        for output in OUTPUTS
                        for row in outputs[output].reshape(-1, case.topk)
                    ]
                )
            exact = _fp64_scores(case, inputs)
            for output in OUTPUTS:
                for row, position in zip(
                    exact[output], case.query_positions(output), strict=True
                ):
                    margins[kind].append(
                        fp64_margin(
                            row.tolist(), needle, position, case.topk, case.local_blocks
                        )
                    )
    cells = []
    for kind in NEEDLES:
        finite = sorted(m for m in margins[kind] if math.isfinite(m))
        common = {
            "length": length,
            "needle": kind,
            "fp8": fmt.dtype,
            "kept_fp64": sum(m > 0 for m in margins[kind]) / len(margins[kind]),
            "margin_median": finite[len(finite) // 2] if finite else math.inf,
        }
        for arm in ARMS:
            change = paired_change(kept[kind, arm], kept[kind, REFERENCE_ARM])
            cells.append({**common, "arm": arm, **change})
    return cells


def child(hardware: str, lengths: list[int], haystacks: int) -> dict[str, Any]:
    from vllm_minimax_m3_kv_sim.kernels import prepare_triton

    device = prepare_triton(hardware)
    return run_cells(device, lengths, haystacks)


def run_cells(device: str, lengths: list[int], haystacks: int) -> dict[str, Any]:
    start = time.perf_counter()
    cells = []
    for length in lengths:
        done = _length(length, haystacks, device)
        cells += done
        # Progress, so a run cut short still shows the lengths it finished.
        print(f"needle_retention: {json.dumps(done)}", flush=True)
    gpu = None
    if device == "cuda":
        import torch

        gpu = torch.cuda.get_device_name()
    return {
        "device": device,
        "gpu": gpu,
        "cells": cells,
        "seconds": time.perf_counter() - start,
    }


def measure(size: str, workers: int, haystacks: int | None = None) -> dict[str, Any]:
    from vllm_minimax_m3_kv_sim.kernels import has_cuda_gpu, kernel_env

    gpu = has_cuda_gpu()
    lengths = GPU_LENGTHS if gpu else CPU_LENGTHS
    count = haystacks or HAYSTACKS["gpu" if gpu else size]
    # A CUDA GPU runs CUDA's scorers only; the ROCm paths need their GPUs.
    paths = (
        ["CUDA Triton (H200)"]
        if gpu
        else list(QUICK_PATHS if size == "quick" else PATHS)
    )

    def run(path: str) -> tuple[str, dict[str, Any]]:
        args = ["--hardware", PATHS[path], "--lengths", json.dumps(list(lengths)),
                "--haystacks", str(count)]  # fmt: skip
        return path, run_child(__spec__.name, args, kernel_env())

    with ThreadPoolExecutor(workers) as pool:
        parts = dict(pool.map(run, paths))
    rows = [{"path": path, **cell} for path in paths for cell in parts[path]["cells"]]
    return {"device": next(iter(parts.values()))["device"], "size": size, "rows": rows}


def saved_result(path: Path) -> dict[str, Any]:
    """A saved run: ``--json``'s output, or one CUDA child's (the device
    check runs the child alone, where the GPU is)."""
    saved = json.loads(path.read_text(encoding="utf-8"))
    if "cells" in saved:
        path_name = "CUDA Triton (H200)"
        saved["rows"] = [{"path": path_name, **cell} for cell in saved.pop("cells")]
    return saved


def render(result: dict[str, Any]) -> str:
    device = result.get("gpu") or result["device"]
    header = (
        "Needle retention against bf16, paired (same haystacks and choices), "
        f"vLLM's indexer scorers on {device}"
        + (" (Triton interpreter)" if device == "cpu" else "")
    )
    body = [
        [
            row["path"],
            f"{row['length']:,}",
            row["needle"],
            f"{row['haystacks']} x {row['rows'] // row['haystacks']}",
            f"{row['kept_fp64']:.3f}",
            f"{row['margin_median']:+.2f}",
            row["arm"] if row["arm"] != "fp8" else row["fp8"].removeprefix("float8_"),
            f"{row['kept'] / row['rows']:.3f}",
            f"{row['kept_reference'] / row['rows']:.3f}",
            f"{row['lost']} / {row['gained']}",
            f"{row['change_points']:+.1f} [{row['interval'][0]:+.1f}, "
            f"{row['interval'][1]:+.1f}]",
        ]
        for row in result["rows"]
    ]
    headers = ["path", "context", "needle", "haystacks x choices", "kept, fp64",
               "margin (median)", "arm", "kept, arm", "kept, bf16", "lost / gained",
               "change, points [95%]"]  # fmt: skip
    return "\n".join([header, "", table(headers, body)])


def main() -> None:
    parser = sweep_parser(__doc__.splitlines()[0], "3 haystacks, one path")
    parser.add_argument(
        "--direct",
        type=Path,
        metavar="JSON",
        help="run one path in this process and write its JSON here (on a GPU "
        "machine without vLLM, from the device bundle; --render prints it)",
    )
    parser.add_argument(
        "--hardware",
        choices=sorted(PATHS.values()),
        default="h200",
        help="the path a --direct run simulates where there is no GPU",
    )
    parser.add_argument(
        "--lengths", help="context lengths as a JSON list, e.g. '[16384, 65536]'"
    )
    parser.add_argument("--haystacks", type=int, default=None)
    parser.add_argument("--render", type=Path, metavar="JSON")
    options = parser.parse_args()
    if options.render is not None:
        print(render(saved_result(options.render)))
        return
    if options.direct is not None:
        lengths = json.loads(options.lengths) if options.lengths else GPU_LENGTHS
        result = child(options.hardware, lengths, options.haystacks or HAYSTACKS["gpu"])
        options.direct.write_text(json.dumps(result), encoding="utf-8")
        return
    sweep_main(
        options,
        lambda: child(options.hardware, json.loads(options.lengths), options.haystacks),
        lambda size, workers: measure(size, workers, options.haystacks),
        render,
    )


if __name__ == "__main__":
    main()
