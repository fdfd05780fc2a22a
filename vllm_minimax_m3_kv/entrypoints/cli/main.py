"""``vllm-minimax-m3-kv [check] ... | status | selftest | bench | --version``.

A small dispatcher, as ``vllm/entrypoints/cli/main.py`` is: each command is
imported only when it runs, so ``status`` never pays for ``check``'s imports
and neither pays for vLLM's until it needs them.
"""

from __future__ import annotations

import difflib
import sys
from collections.abc import Callable
from pathlib import Path

from vllm_minimax_m3_kv._versions import DISTRIBUTION

PROG = DISTRIBUTION  # the console script
EXIT_USAGE = 1


def _check(argv: list[str]) -> int:
    from vllm_minimax_m3_kv.entrypoints.check.main import main

    return main(argv)


def _status(argv: list[str]) -> int:
    # About this node, not a target: no CPU platform, no offline default.
    from vllm_minimax_m3_kv.entrypoints.status import main

    return main(argv)


def _selftest(argv: list[str]) -> int:
    # On this node's GPU, with its own vLLM platform: no offline target.
    from vllm_minimax_m3_kv.entrypoints.selftest import main

    return main(argv)


def _bench(argv: list[str]) -> int:
    # Times this node's GPU; --plan --target T plans for another.
    from vllm_minimax_m3_kv.entrypoints.bench import main

    return main(argv)


COMMANDS: dict[str, Callable[[list[str]], int]] = {
    "check": _check,
    "status": _status,
    "selftest": _selftest,
    "bench": _bench,
}
"""Each command and what runs it; ``check`` is also the default."""


def main(argv: list[str] | None = None) -> int:
    """Run the command ``argv`` names; its exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    first = argv[0] if argv else ""
    if first in COMMANDS:
        return COMMANDS[first](argv[1:])
    # No command: check's flags (--version, --help) or a model path.
    if not first or first.startswith("-") or "/" in first or Path(first).exists():
        return _check(argv)
    nearest = difflib.get_close_matches(first, COMMANDS, n=1)
    hint = f" (did you mean {nearest[0]}?)" if nearest else ""
    from vllm_minimax_m3_kv.entrypoints.output import Output

    Output().problem(
        f"{PROG}: unknown command {first!r}{hint}; commands: "
        f"{', '.join(COMMANDS)} ({PROG} check --help; {PROG} status), or --version"
    )
    return EXIT_USAGE


def entry() -> None:
    """Console script ``vllm-minimax-m3-kv``."""
    sys.exit(main())
