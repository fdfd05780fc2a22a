"""A fork server for :func:`vllm_minimax_m3_kv_sim.plumbing.children.run_python`.

``python -m vllm_minimax_m3_kv_sim.plumbing.fork_server SOCKET`` listens, prints ``ready``, imports
:data:`vllm_minimax_m3_kv_sim.plumbing.children.PRELOAD` when the first request comes, and serves one
request per connection: a JSON object with
``argv``, ``env``, ``cwd``, ``stdout`` and ``stderr`` (file paths). For each it
forks a supervisor, which forks the runner (``python ARGV`` as a fresh
interpreter would run it, with that environment), sends the runner's pid, waits
for it and sends its exit code. Every process is reaped with ``waitpid``, so
the CPU the children use is counted where the caller measures it.
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import json
import os
import resource
import runpy
import signal
import socket
import sys
import traceback


def _become_fresh_interpreter(request: dict) -> int:
    """In the runner: ``python ARGV`` with the request's environment."""
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    for fd, key in ((1, "stdout"), (2, "stderr")):
        os.dup2(os.open(request[key], os.O_WRONLY | os.O_CREAT | os.O_TRUNC), fd)
    env = request["env"]
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(env)
    sys.dont_write_bytecode = bool(env.get("PYTHONDONTWRITEBYTECODE"))
    for entry in reversed(env.get("PYTHONPATH", "").split(os.pathsep)):
        if entry:
            sys.path.insert(0, entry)
    importlib.invalidate_caches()
    argv = request["argv"]
    try:
        if argv[0] == "-m":
            sys.argv = [argv[1], *argv[2:]]
            runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
        elif argv[0] == "-c":
            sys.argv = ["-c", *argv[2:]]
            exec(compile(argv[1], "<string>", "exec"), {"__name__": "__main__"})
        else:
            sys.argv = list(argv)
            runpy.run_path(argv[0], run_name="__main__")
        code = 0
    except SystemExit as done:
        if done.code is None or isinstance(done.code, int):
            code = done.code or 0
        else:
            print(done.code, file=sys.stderr)
            code = 1
    except BaseException:
        traceback.print_exc()
        code = 1
    with contextlib.suppress(Exception):
        sys.stdout.flush()
        sys.stderr.flush()
    return code


def _supervise(connection: socket.socket) -> None:
    """In the supervisor: read the request, run it, report pid and exit code."""
    with connection.makefile("rwb", buffering=0) as stream:
        request = json.loads(stream.readline())
        pid = os.fork()
        if pid == 0:
            connection.close()
            os._exit(_become_fresh_interpreter(request))
        stream.write(f"{pid}\n".encode())
        _, status, usage = os.wait4(pid, 0)
        _log_cpu(request, usage)
        stream.write(f"{os.waitstatus_to_exitcode(status)}\n".encode())


def _log_cpu(request: dict, usage: resource.struct_rusage) -> None:
    """One JSON line per child to ``$SIM_FORK_CPU_LOG``, to see where a test
    run's CPU goes."""
    path = os.environ.get("SIM_FORK_CPU_LOG")
    if path:
        line = {"argv": request["argv"][:8], "cpu_s": usage.ru_utime + usage.ru_stime}
        with open(path, "a") as log:
            log.write(json.dumps(line) + "\n")


def _reap() -> None:
    with contextlib.suppress(ChildProcessError):
        while os.waitpid(-1, os.WNOHANG)[0] != 0:
            pass


def _preload() -> None:
    from vllm_minimax_m3_kv_sim.plumbing.children import PRELOAD

    # humming (vLLM's quantization kernels) starts two background builds of its
    # CUDA helpers when imported, ~10 CPU-s each, which only warm a cache it
    # otherwise fills on first use. Only this process imports it (children
    # inherit the module, not this variable), so only it is told not to.
    os.environ["HUMMING_DISABLE_PARALLEL_BUILD"] = "1"
    for module in PRELOAD:
        importlib.import_module(module)
    # Children never collect what the server holds: their collections skip it
    # (and leave its pages shared).
    gc.freeze()
    _log_server("preload")


def serve(path: str) -> None:
    """Listen at once; import PRELOAD when the first request comes (a server
    nobody asks costs nothing, and its starter never waits for it)."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(16)
    listener.settimeout(1.0)
    stopping = False
    preloaded = False

    def stop(*_: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, stop)
    print("ready", flush=True)
    while not stopping:
        _reap()
        try:
            connection, _ = listener.accept()
        except TimeoutError:
            continue
        except InterruptedError:
            continue
        if not preloaded:
            _preload()
            preloaded = True
        if os.fork() == 0:
            listener.close()
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            connection.settimeout(None)
            _supervise(connection)
            os._exit(0)
        connection.close()
    listener.close()
    # Wait for every supervisor, so their children's CPU time is accounted.
    with contextlib.suppress(ChildProcessError):
        while True:
            os.waitpid(-1, 0)
    _log_server("total")


def _log_server(stage: str) -> None:
    """The server's own CPU (``preload``: importing PRELOAD; ``total``: with
    every supervisor it reaped, i.e. its children and the forks around them)."""
    path = os.environ.get("SIM_FORK_CPU_LOG")
    if path:
        own = resource.getrusage(resource.RUSAGE_SELF)
        reaped = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = own.ru_utime + own.ru_stime
        if stage == "total":
            cpu += reaped.ru_utime + reaped.ru_stime
        line = {"argv": ["<fork server>", stage], "cpu_s": cpu, "server": os.getpid()}
        with open(path, "a") as log:
            log.write(json.dumps(line) + "\n")


if __name__ == "__main__":
    serve(sys.argv[1])
