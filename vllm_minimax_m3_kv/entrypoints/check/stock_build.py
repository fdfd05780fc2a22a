"""What stock vLLM 0.33 does with a command, asked of stock vLLM itself.

With this plugin left out (``VLLM_PLUGINS``), ``check`` does not predict
stock's pool from rules of its own: a child process, with the plugin not
loaded and the target's platform simulated (:mod:`.target_platform`), runs
vLLM's config validation, builds the model on the meta device (where vLLM's
MiniMax-M3 code selects its indexer and refuses what it cannot run) and
plans the KV cache with vLLM's planner. Its answer is stock's, by
construction: a refusal in vLLM's words, or the specs' dtypes, whether
vLLM's workers and scheduler call the pool mixed, and its bytes per token.

A child because one process holds one platform and the plugin, once
registered, cannot be unloaded; the parent starts it before its own
judgement, so the two overlap.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass

from vllm_minimax_m3_kv.entrypoints.check.arguments import CheckUsageError

ANSWER = "stock-build-answer "
"""The prefix of the child's one answer line on stdout."""


@dataclass(frozen=True)
class StockBuild:
    """Stock vLLM 0.33's answer for one command on one target."""

    refused: str = ""
    """vLLM's own words where it refuses the command ("" where it starts)."""
    refused_at: str = ""
    """``config`` (vLLM's config validation) or ``model build``."""
    indexer_kv_dtype: str = ""
    """The index cache dtype vLLM resolves (``resolve_indexer_kv_dtype``)."""
    kinds: tuple[str, ...] = ()
    """Each (dtype, quantization mode) vLLM's specs hold: two or more is
    what vLLM calls a mixed pool."""
    workers_zero: tuple[bool, ...] = ()
    scheduler_zeroes: bool = False
    main_bytes: int = 0
    indexer_bytes: int = 0
    """Bytes per token on one rank, from the specs the layers returned."""

    @property
    def mixed(self) -> bool:
        return any(self.workers_zero)


def start(argv: list[str], target: str) -> subprocess.Popen[str]:
    """Start stock's build for check's ``argv`` (bundled model already in
    place of a missing one) in a child that inherits this environment."""
    env = dict(os.environ)
    # check runs on vLLM's CPU platform; the child is the target's.
    env.pop("VLLM_TARGET_DEVICE", None)
    child = subprocess.Popen(
        [sys.executable, "-m", f"{__package__}.stock_child"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    assert child.stdin is not None
    child.stdin.write(json.dumps({"argv": argv, "target": target}))
    child.stdin.close()
    child.stdin = None  # written: communicate() only reads
    return child


def answer(child: subprocess.Popen[str]) -> StockBuild:
    """The child's answer; a usage error where it could not build at all."""
    stdout, stderr = child.communicate()
    for line in reversed(stdout.splitlines()):
        if line.startswith(ANSWER):
            fields = json.loads(line[len(ANSWER) :])
            return StockBuild(
                **{k: tuple(v) if isinstance(v, list) else v for k, v in fields.items()}
            )
    tail = (stderr.strip().splitlines() or ["no output"])[-1]
    raise CheckUsageError(
        f"stock vLLM 0.33's build of this command could not run here: {tail}"
    )
