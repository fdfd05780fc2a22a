"""How long an operator waits for ``check``'s answers that need no vLLM.

``python -m benchmarks.check_latency [--rounds 5] [--json]``

Times whole commands as a shell runs them, in fresh processes, rounds
interleaved so a busy machine slows every command alike: ``check --help``, the
usage errors (no ``--target``, a mistyped one, a model path that does not
exist), and, as the yardstick, ``python -c "import vllm.engine.arg_utils"``,
the import every full verdict starts with. Reports each command's median and
its ratio to the yardstick's median from the same run. A full verdict (vLLM's
own config validation on the target) costs that import and more; see
``docs/check.md``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

from benchmarks._common import table

CHECK = [sys.executable, "-m", "vllm_minimax_m3_kv"]
COMMANDS: dict[str, list[str]] = {
    "check --help": [*CHECK, "check", "--help"],
    "check (no --target)": [*CHECK, "check"],
    "check --target mi35x (mistyped)": [*CHECK, "check", "--target", "mi35x"],
    "check --target mi355x /no/such/model": [
        *CHECK,
        "check",
        "--target",
        "mi355x",
        "/no/such/model",
    ],
    "--version": [*CHECK, "--version"],
    "check --kv-cache-dtype fp9 (typo)": [
        *CHECK,
        "check",
        "--target",
        "mi355x",
        "--kv-cache-dtype",
        "fp9",
    ],
    "check -tp 3 (does not divide the heads)": [
        *CHECK,
        "check",
        "--target",
        "mi355x",
        "-tp",
        "3",
    ],
}
YARDSTICK = "import vllm.engine.arg_utils"
FAST_ENOUGH = 0.2  # at most a fifth of the yardstick


def _seconds(command: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(command, capture_output=True, check=False)
    return time.perf_counter() - start


def measure(rounds: int) -> dict:
    commands = {**COMMANDS, YARDSTICK: [sys.executable, "-c", YARDSTICK]}
    _seconds(commands[YARDSTICK])  # page vLLM's files in once, for everyone
    times: dict[str, list[float]] = {name: [] for name in commands}
    for _ in range(rounds):
        for name, command in commands.items():
            times[name].append(_seconds(command))
    medians = {name: statistics.median(values) for name, values in times.items()}
    yardstick = medians.pop(YARDSTICK)
    ratios = {name: seconds / yardstick for name, seconds in medians.items()}
    return {
        "rounds": rounds,
        "yardstick": YARDSTICK,
        "yardstick_seconds": round(yardstick, 3),
        "seconds": {name: round(s, 3) for name, s in medians.items()},
        "ratio_to_yardstick": {name: round(r, 3) for name, r in ratios.items()},
        "max_seconds": round(max(medians.values()), 3),
        "max_ratio": round(max(ratios.values()), 3),
        "fast_enough": max(ratios.values()) <= FAST_ENOUGH
        and max(medians.values()) < 1.0,
        "cli": shutil.which("vllm-minimax-m3-kv") is not None,
    }


def render(result: dict) -> str:
    rows = [
        [f"`{name}`", f"{seconds:.2f}", f"{result['ratio_to_yardstick'][name]:.3f}"]
        for name, seconds in result["seconds"].items()
    ]
    return "\n".join(
        [
            f"Median of {result['rounds']} fresh processes per command; yardstick "
            f'`python -c "{result["yardstick"]}"`: '
            f"{result['yardstick_seconds']:.2f} s",
            "",
            table(["command", "seconds", "ratio to yardstick"], rows),
        ]
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", action="store_true", help="print JSON only")
    parser.add_argument("--out", help="also write the JSON here")
    options = parser.parse_args()
    result = measure(options.rounds)
    if not options.json:
        print(render(result))
        print()
    print(json.dumps(result))
    if options.out:
        Path(options.out).write_text(json.dumps(result))


if __name__ == "__main__":
    main()
