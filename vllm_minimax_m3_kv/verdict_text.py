"""How a verdict reads, in one place: a refusal as the ``ValueError`` the
live hook raises and ``check`` prints (:func:`refusal_text`), each fix as the
edits ``check --json`` gives (:func:`fix_edits`), and each fix as a whole
``vllm serve`` command that runs as printed. Imported by the live hook and by
the CLI alike, and imports neither.

A fix is a set of edits (variables, flags to set, flags to drop); pasted on
its own, ``VAR=1  # ...`` sets an unexported shell variable and ``--flag v``
is "command not found". Here each fix is applied to the user's own command:
its variables prefix the command (beside the ones it already had), a flag it
sets replaces the user's value in any spelling vLLM takes (``--a-b v``,
``--a_b=v``), a field of a config group given as JSON
(``--speculative-config '{...}'``) is set inside that JSON (vLLM refuses the
JSON and a dotted field of the same group side by side), and a flag it drops
goes with all its values.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from vllm_minimax_m3_kv.config.pool_facts import AITER_ENV, SHUFFLE_KV_ENV
from vllm_minimax_m3_kv.config.verdicts import Fix
from vllm_minimax_m3_kv.envs import ALLOW_MIXED_ENV

SERVE = ("vllm", "serve")
FIXED_COMMANDS_HEADING = "The same command with each fix applied, as it runs:"
"""Printed after a refusal's fixes, before each whole fixed command."""


def _spelling(word: str) -> str:
    """The flag a word names, as vLLM's parser reads it: ``--a_b=v`` is
    ``--a-b``; a config group's field keeps its key (``--a-b.c_d``)."""
    name = word.split("=", 1)[0]
    group, dot, field = name.partition(".")
    return "--" + group[2:].replace("_", "-") + dot + field


def _values_after(words: Sequence[str], index: int, arity: int | None) -> int:
    """How many words after ``words[index]`` are its values (``None``: as
    many as do not look like a flag, for ``nargs='+'``)."""
    if "=" in words[index]:
        return 0
    if arity is not None:
        return arity
    count = 0
    for word in words[index + 1 :]:
        if word.startswith("-") and not word[1:2].isdigit():
            break
        count += 1
    return count


def _drop(
    words: list[str], flag: str, arity: Callable[[str], int | None]
) -> tuple[list[str], int | None]:
    """``words`` without ``flag`` and its values; where it stood (or None)."""
    out: list[str] = []
    where = None
    index = 0
    while index < len(words):
        word = words[index]
        if word.startswith("--") and _spelling(word) == flag:
            where = len(out) if where is None else where
            index += 1 + _values_after(words, index, arity(flag))
            continue
        out.append(word)
        index += 1
    return out, where


def _json_value(value: str) -> Any:
    """A flag's value as JSON holds it: ``false`` a boolean, ``2`` a number,
    anything else (``fp8``) a string."""
    try:
        return json.loads(value)
    except ValueError:
        return value


def _set_in_json(words: list[str], group: str, field: str, value: str) -> bool:
    """Set ``field`` in the JSON value of ``group`` if the command gives one."""
    for index, word in enumerate(words):
        if not word.startswith("--") or _spelling(word) != group:
            continue
        inline = "=" in word
        raw = word.split("=", 1)[1] if inline else words[index + 1 : index + 2]
        text = raw if isinstance(raw, str) else (raw[0] if raw else "")
        try:
            config = json.loads(text)
        except ValueError:
            return False
        if not isinstance(config, dict):
            return False
        config[field] = _json_value(value)
        edited = json.dumps(config, separators=(",", ":"))
        if inline:
            words[index] = f"{word.split('=', 1)[0]}={edited}"
        else:
            words[index + 1] = edited
        return True
    return False


def apply_fix(
    argv: Sequence[str],
    fix: Mapping[str, Any],
    arity: Callable[[str], int | None] = lambda flag: 1,
) -> list[str]:
    """The ``vllm serve`` arguments ``argv`` with ``fix`` (check's JSON form:
    ``flags``, ``remove``) applied; ``arity`` says how many values a flag
    takes (``None``: one or more)."""
    words = list(argv)
    for flag in fix.get("remove", ()):
        words, _ = _drop(words, _spelling(flag), arity)
    for flag, value in fix.get("flags", ()):
        flag = _spelling(flag)
        group, dot, field = flag.partition(".")
        if dot and _set_in_json(words, group, field, value):
            continue
        words, where = _drop(words, flag, arity)
        at = len(words) if where is None else where
        words[at:at] = [flag, value]
    return words


def fixed_command(
    argv: Sequence[str],
    env: Mapping[str, str],
    fix: Mapping[str, Any],
    arity: Callable[[str], int | None] = lambda flag: 1,
) -> str:
    """One line that runs as printed: the command's variables with the fix's,
    ``vllm serve`` and its fixed arguments, then what the fix does."""
    variables = {**env, **dict(fix.get("env", {}))}
    words = [f"{name}={shlex.quote(value)}" for name, value in variables.items()]
    words += [*SERVE, *map(shlex.quote, apply_fix(argv, fix, arity))]
    notes = [fix["summary"], *(f"needs {need}" for need in fix.get("requires", ()))]
    if "token_capacity_vs_stock" in fix:
        notes.append(
            f"{fix['token_capacity_vs_stock']:.2f}x the KV tokens of stock vLLM "
            "0.33 running the command as typed"
        )
    return f"{' '.join(words)}  # {'; '.join(notes)}"


COMMAND_ENV = (
    AITER_ENV,
    SHUFFLE_KV_ENV,
    ALLOW_MIXED_ENV,
    "VLLM_ALLOW_LONG_MAX_MODEL_LEN",
)
"""The variables the verdict reads (the plugin's, AITER's, and vLLM's own
length override): a fixed command carries the ones that are set."""


def command_env() -> dict[str, str]:
    """The :data:`COMMAND_ENV` variables this process has, as set."""
    return {name: os.environ[name] for name in COMMAND_ENV if name in os.environ}


def arity_of(parser: argparse.ArgumentParser) -> Callable[[str], int | None]:
    """How many values each flag of ``parser`` takes (None: one or more)."""
    table = parser._option_string_actions

    def arity(flag: str) -> int | None:
        action = table.get(flag)
        nargs = None if action is None else action.nargs
        if action is None or nargs is None:
            return 1
        return nargs if isinstance(nargs, int) else None

    return arity


def refusal_text(message: str, fixed_commands: Sequence[str] = ()) -> str:
    """A refusal with its fixes (``message``), then each fix as the whole
    command, where the command is known."""
    lines = [message]
    if fixed_commands:
        lines += [
            FIXED_COMMANDS_HEADING,
            *(f"  {command}" for command in fixed_commands),
        ]
    return "\n".join(lines)


def fix_edits(fix: Fix) -> dict[str, Any]:
    """A fix as the edits :func:`apply_fix` makes (check's ``--json`` form)."""
    return {
        "line": fix.render(),
        "summary": fix.summary,
        "env": dict(fix.env),
        "flags": [list(pair) for pair in fix.flags],
        "remove": list(fix.without),
        "requires": list(fix.requires),
    }


def this_serve_command() -> list[str] | None:
    """This process's ``vllm serve`` arguments, or None when it is not
    ``vllm serve`` (an offline ``LLM(...)``, a test, another entry point)."""
    argv = sys.argv
    if len(argv) < 3 or argv[1] != "serve" or Path(argv[0]).name != "vllm":
        return None
    return argv[2:]


def fixed_serve_commands(fixes: Sequence[Fix]) -> list[str]:
    """Each fix applied to this process's own ``vllm serve`` command, as it
    runs; [] outside ``vllm serve``. Only on a refusal: it builds vLLM's serve
    parser for the flags' arities."""
    argv = this_serve_command()
    if argv is None or not fixes:
        return []
    from vllm.entrypoints.common.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    try:
        arity = arity_of(make_arg_parser(FlexibleArgumentParser()))
        env = command_env()
        return [fixed_command(argv, env, fix_edits(fix), arity) for fix in fixes]
    except Exception:
        return []
