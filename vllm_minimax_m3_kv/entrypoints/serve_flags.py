"""``vllm serve``'s flag names, for answering a mistyped flag without vLLM.

The list is read from vLLM's own parser (the one ``check`` builds) and
shipped with the vLLM version it was read from; it is used only when that
version is installed, so a newer vLLM's flags are never refused by an old
list. ``tests/entrypoints/early_answers.py`` checks it equals the installed
parser's flags. Regenerate with ``python -m vllm_minimax_m3_kv.entrypoints.serve_flags``.
"""

from __future__ import annotations

import difflib
import json
import os
from importlib import metadata, resources
from pathlib import Path

_DATA = "vllm_serve_flags.json"


def flags_of_parser(parser: object) -> list[str]:
    """Every long option string a parser takes: argparse's own table of
    them, which holds the ``--no-enable-x`` forms vLLM's EnableDisableAction
    still takes but hides from an action's ``option_strings``."""
    table = getattr(parser, "_option_string_actions", {})
    return sorted(option for option in table if option.startswith("--"))


def shipped_flags() -> tuple[str, list[str]]:
    """The shipped list and the vLLM version it was read from."""
    data = json.loads(
        (resources.files("vllm_minimax_m3_kv") / "data" / _DATA).read_text()
    )
    return data["vllm"], data["flags"]


def known_flags() -> list[str] | None:
    """The installed vLLM's serve flags, or None when the shipped list is of
    another vLLM version (then vLLM's own parser answers)."""
    try:
        version, flags = shipped_flags()
        installed = metadata.version("vllm")
    except (OSError, ValueError, KeyError, metadata.PackageNotFoundError):
        return None
    return flags if installed == version else None


def mistyped_flag(words: list[str], own: list[str]) -> str | None:
    """The first ``--flag`` vLLM does not take with a close known one, as
    ``"--kv-cache-dtpye; did you mean --kv-cache-dtype?"``; None otherwise."""
    flags = known_flags()
    if flags is None:
        return None
    valid = set(flags) | set(own)
    for word in words:
        if not word.startswith("--") or word == "--":
            continue
        name = word.split("=", 1)[0]
        # vLLM's parser takes --a_b for --a-b, and --group.key for a config
        # group's field (checked by vLLM itself).
        spelled = "--" + name[2:].replace("_", "-")
        if "." in name or spelled in valid:
            continue
        nearest = difflib.get_close_matches(spelled, sorted(valid), n=1, cutoff=0.8)
        if nearest:
            return f"{name}; did you mean {nearest[0]}?"
    return None


def main() -> None:
    # vLLM's serve parser builds on its CPU platform on any machine, as check's.
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    from vllm_minimax_m3_kv.entrypoints.check.arguments import (
        build_parser,
        own_flag_names,
    )

    path = Path(str(resources.files("vllm_minimax_m3_kv") / "data" / _DATA))
    own = own_flag_names()
    flags = [f for f in flags_of_parser(build_parser()) if f not in own]
    path.write_text(
        json.dumps({"vllm": metadata.version("vllm"), "flags": flags}, indent=0) + "\n"
    )
    print(f"{path}: {len(flags)} flags of vLLM {metadata.version('vllm')}")


if __name__ == "__main__":
    main()
