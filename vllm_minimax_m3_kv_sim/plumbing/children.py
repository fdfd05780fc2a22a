"""Child processes for simulated platforms: vLLM fixes its platform once per process.

Every child is forked from a server that has already imported the libraries
vLLM sits on (torch, dynamo, inductor, triton, transformers, flashinfer, ...)
but never vLLM or this plugin: each child still imports vLLM, simulates its
platform and loads its plugins from scratch, with the environment it was
given, and skips the rest of the imports (a child that builds the tiny
MiniMax-M3 costs about 2.5 CPU-s; 7.8 with only torch, Triton and
transformers preloaded). ``SIM_FORK_CPU_LOG=FILE`` logs each child's argv and CPU
seconds, and each server's own (``["<fork server>", "preload"]``, and
``"total"``: everything it and its children used, the children's lines
included). Shared by the tests, the reliability report and the benchmarks.
"""

from __future__ import annotations

import atexit
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vllm_minimax_m3_kv_sim import REPO

# Set per child by whoever needs them, never inherited from the caller's shell.
_OWN_VARIABLES = ("VLLM_PLUGINS", "VLLM_TARGET_DEVICE")

PRELOAD = (
    "numpy",
    "torch",
    "torch._dynamo",
    "torch._inductor.lowering",
    "torch._inductor.compile_fx",
    "triton",
    "pydantic",
    "fastapi",
    "transformers",
    # What vLLM's config, model and planner code import from elsewhere,
    # picked by ``python -X importtime`` (about 4 s of CPU per child).
    "cutlass",  # vllm.utils.b12x
    "flashinfer",  # vLLM's CUDA attention and MoE paths
    "quack.compile_utils",
    "openai.types.responses",  # vllm.entrypoints' request types
    "transformers.models.auto.image_processing_auto",
    "transformers.modeling_gguf_pytorch_utils",
    "transformers.modeling_utils",
    "transformers.processing_utils",
    "humming.ops",  # vllm's humming quantization schema
    "requests",
    "aiohttp",
    "xgrammar",
    "zmq",
    "cv2",
    "torchcodec.decoders",
    "opentelemetry.exporter.otlp.proto.grpc.trace_exporter",
)
"""Imported once by the fork server; never vLLM (whose modules bind the
platform at import) nor this plugin."""
FROZEN_AT_PRELOAD = ("HF_", "HUGGINGFACE_", "TRANSFORMERS_", "TRITON_")
"""Variables the preloaded modules read at import (Hugging Face's offline
switches; Triton's interpreter switch, which decides how its own library
functions are built). Children with other values get a server of their own,
started with them."""


def child_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """This environment without the variables a child must be given explicitly."""
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith("VLLM_ROCM_") and key not in _OWN_VARIABLES
    }
    env["PYTHONPATH"] = os.pathsep.join(
        filter(None, [str(REPO), env.get("PYTHONPATH")])
    )
    # Children never download; a test that needs otherwise says so.
    env.setdefault("HF_HUB_OFFLINE", "1")
    return {**env, **(extra or {})}


def _frozen(env: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if k.startswith(FROZEN_AT_PRELOAD)}


@dataclass(frozen=True)
class Completed:
    returncode: int
    stdout: str
    stderr: str


class _ForkServer:
    """``vllm_minimax_m3_kv_sim.plumbing.fork_server``, started on first use, stopped at exit."""

    def __init__(self, env: dict[str, str] | None = None) -> None:
        self._lock = threading.Lock()
        self._process: subprocess.Popen[str] | None = None
        self._path = ""
        self.env: dict[str, str] = dict(env or {})

    def address(self) -> str:
        with self._lock:
            for variable in (ADDRESS_ENV, SHARED_ADDRESS_ENV):
                if self is _server and variable in os.environ:
                    # A server another process started.
                    self.env = self.env or child_env()
                    return os.environ[variable]
            if self._process is None or self._process.poll() is not None:
                self._start()
            return self._path

    def _start(self) -> None:
        self._path = str(Path(tempfile.mkdtemp(prefix="sim-fork-"), "socket"))
        self.env = self.env or child_env()
        self._process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "vllm_minimax_m3_kv_sim.plumbing.fork_server",
                self._path,
            ],
            cwd=REPO,
            env=self.env,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self._process.stdout is not None
        if self._process.stdout.readline().strip() != "ready":
            raise RuntimeError("the fork server did not start")
        atexit.register(self.stop)

    def stop(self) -> None:
        if self._process is not None and self._process.poll() is None:
            self._process.terminate()
            self._process.wait(timeout=60)


_server = _ForkServer()
_servers_by_frozen_env: dict[tuple, _ForkServer] = {}
_servers_lock = threading.Lock()
ADDRESS_ENV = "SIM_FORK_SERVER"
"""Set for processes a test starts (e.g. a launch script) that run Python
children through this process's server (``python -m vllm_minimax_m3_kv_sim.plumbing.forked``)."""
SHARED_ADDRESS_ENV = "SIM_FORK_SERVER_SHARED"
"""Set by a test run's xdist controller for its workers: the server they
share for children with the usual environment (one preload, not one per
worker). Servers for other preload environments they still start themselves."""


def server_address() -> str:
    return _server.address()


def run_python(
    argv: list[str],
    env: dict[str, str] | None = None,
    timeout: float = 900,
    cwd: Path = REPO,
    exact_env: bool = False,
) -> Completed:
    """``python ARGV`` (``-m MODULE ...``, ``-c CODE ...`` or ``SCRIPT ...``)
    with :func:`child_env` plus ``env`` (or exactly ``env``), forked from the
    preloaded server."""
    full_env = dict(env or {}) if exact_env else child_env(env)
    server = _server
    address = server.address()
    frozen = _frozen(full_env)
    if frozen != _frozen(server.env):
        if ADDRESS_ENV in os.environ:  # not ours to start another
            return _run_fresh(argv, full_env, timeout, cwd)
        with _servers_lock:
            key = tuple(sorted(frozen.items()))
            server = _servers_by_frozen_env.setdefault(
                key, _ForkServer({**child_env(), **frozen})
            )
        address = server.address()
    with tempfile.TemporaryDirectory() as tmp:
        out, err = Path(tmp, "stdout"), Path(tmp, "stderr")
        request = {
            "argv": list(argv),
            "env": full_env,
            "cwd": str(cwd),
            "stdout": str(out),
            "stderr": str(err),
        }
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as connection:
            connection.connect(address)
            connection.settimeout(timeout)
            stream = connection.makefile("rwb", buffering=0)
            stream.write(json.dumps(request).encode() + b"\n")
            pid = int(stream.readline())
            try:
                returncode = int(stream.readline())
            except TimeoutError:
                os.kill(pid, signal.SIGKILL)
                raise subprocess.TimeoutExpired(argv, timeout) from None
        return Completed(
            returncode, out.read_text(errors="replace"), err.read_text(errors="replace")
        )


def _run_fresh(
    argv: list[str], env: dict[str, str], timeout: float, cwd: Path
) -> Completed:
    proc = subprocess.run(
        [sys.executable, *argv],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    return Completed(proc.returncode, proc.stdout, proc.stderr)


def _run(argv: list[str], env: dict[str, str] | None, timeout: float) -> str:
    proc = run_python(argv, env, timeout)
    if proc.returncode != 0:
        raise RuntimeError(
            f"{' '.join(argv[:4])} failed (exit {proc.returncode}):\n"
            + proc.stderr[-4000:]
        )
    return proc.stdout


def json_from_stdout(
    argv: list[str], env: dict[str, str] | None = None, timeout: float = 900
) -> Any:
    """Run ``python ARGV``; its last line of output is JSON."""
    return json.loads(_run(argv, env, timeout).strip().splitlines()[-1])


def json_from_out_file(
    argv: list[str], env: dict[str, str] | None = None, timeout: float = 1200
) -> Any:
    """Run ``python ARGV --out FILE`` and read the JSON it wrote."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp, "out.json")
        _run([*argv, "--out", str(out)], env, timeout)
        return json.loads(out.read_text())
