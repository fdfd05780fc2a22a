"""``vllm serve``'s flag names and each flag group's help, for answering a
mistyped flag and ``check --help=GROUP`` without importing vLLM.

Both are read from vLLM's own parser (the one ``check`` builds) and shipped
with the vLLM version they were read from; they are used only when that
version is installed, so a newer vLLM's flags are never refused, nor its help
misquoted, by an old table. ``tests/entrypoints/early_answers.py`` checks
they equal the installed parser's. Regenerate with
``python -m vllm_minimax_m3_kv_sim.programs.regenerate_serve_flags`` (a
maintainer's tool: it stays out of the wheel).
"""

from __future__ import annotations

import difflib
import json
from importlib import metadata, resources

DATA_FILE = "vllm_serve_flags.json"
HELP_COLUMNS = 100
"""The terminal width the shipped group help is formatted for (argparse reads
``COLUMNS``); vLLM's live help wraps to the terminal it finds."""


def flags_of_parser(parser: object) -> list[str]:
    """Every long option string a parser takes: argparse's own table of
    them, which holds the ``--no-enable-x`` forms vLLM's EnableDisableAction
    still takes but hides from an action's ``option_strings``."""
    table = getattr(parser, "_option_string_actions", {})
    return sorted(option for option in table if option.startswith("--"))


def _shipped() -> dict:
    return json.loads(
        (resources.files("vllm_minimax_m3_kv") / "data" / DATA_FILE).read_text()
    )


def _for_installed_vllm() -> dict | None:
    """The shipped table, or None when it is of another vLLM version (then
    vLLM's own parser answers)."""
    try:
        data = _shipped()
        installed = metadata.version("vllm")
    except (OSError, ValueError, metadata.PackageNotFoundError):
        return None
    return data if data.get("vllm") == installed else None


def known_flags() -> list[str] | None:
    """The installed vLLM's serve flags, or None (see _for_installed_vllm)."""
    data = _for_installed_vllm()
    return None if data is None else data.get("flags")


def group_help_key(keyword: str) -> str:
    """A ``--help=`` keyword as vLLM's parser matches it to a group title."""
    return keyword.lower().replace("_", "-")


def known_group_help(keyword: str) -> str | None:
    """``check --help=GROUP``'s text for a flag group of the installed vLLM,
    from the shipped table; None for any other keyword (a flag-name search,
    ``all``) or vLLM version, which vLLM's own parser answers."""
    data = _for_installed_vllm()
    return (
        None
        if data is None
        else data.get("group_help", {}).get(group_help_key(keyword))
    )


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


def group_help_of_parser(parser: object) -> dict[str, str]:
    """Each flag group's ``--help=GROUP`` text, as check prints it."""
    from vllm_minimax_m3_kv.entrypoints.check.arguments import vllm_help

    return {
        group_help_key(group.title): vllm_help(parser, group.title)  # type: ignore[arg-type]
        for group in getattr(parser, "_action_groups", [])
        if group.title and " " not in group.title
    }
