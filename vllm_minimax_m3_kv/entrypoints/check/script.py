"""A launch script read as bash would run it, without running anything.

``check --commands FILE`` judges the ``vllm serve`` commands of a script with
the environment bash would give each one: ``export``, ``declare -x``,
``unset``, ``set -a``, plain ``VAR=value`` lines (exported only where bash
exports them), ``env VAR=... vllm serve ...`` and ``VAR=... vllm serve ...``
prefixes, applied in order. ``$VAR`` and ``${VAR:-default}`` are expanded from
what the file set and this process's environment. Nothing is executed: a line
that needs a command run (``$(...)``) or a variable the file and the
environment do not have is reported, not guessed.
"""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field

SERVE = ("vllm", "serve")
# Words that run the command after them (their own options are not parsed).
_RUNNERS = frozenset({"exec", "nohup", "time", "command"})
_SEPARATORS = frozenset({";", "&", "&&", "||", ";;"})
_FD = re.compile(r"(?<=\s)\d+(?=[<>])")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_EXPANSION = re.compile(
    r"\\.|'[^']*'|\$\{(?P<braced>[A-Za-z_][A-Za-z0-9_]*)(?:(?P<op>:?-)(?P<default>[^}]*))?\}"
    r"|\$(?P<bare>[A-Za-z_][A-Za-z0-9_]*)|(?P<subst>\$\(|`)"
)


@dataclass(frozen=True)
class CommandLine:
    """One logical command of the file."""

    number: int
    """Its first physical line, as an editor numbers it."""
    text: str
    """Backslash continuations joined, as the shell joins them."""


@dataclass(frozen=True)
class Serve:
    """A ``vllm serve`` command: its argv after ``serve`` and the variables
    the file gives it (``None``: unset), over this process's environment."""

    argv: list[str]
    env: dict[str, str | None]
    unexported: tuple[str, ...] = ()
    """VLLM_* shell variables the file set without exporting: serve never
    sees them, which the operator may not have meant."""


@dataclass(frozen=True)
class NotServe:
    """A command that is not ``vllm serve``, or one check cannot read."""

    why: str
    may_be_serve: bool = False
    """A line check could not read that names ``vllm serve``: not judged,
    rather than skipped."""


def command_lines(text: str) -> list[CommandLine]:
    """The file's commands: continuations joined; blank and comment lines out."""
    commands: list[CommandLine] = []
    pending: list[str] = []
    start = 0
    for number, line in enumerate(text.splitlines(), 1):
        if not pending:
            if not line.strip() or line.lstrip().startswith("#"):
                continue
            start = number
        # An odd run of trailing backslashes escapes the newline.
        trailing = len(line) - len(line.rstrip("\\"))
        if trailing % 2:
            pending.append(line[:-1])
            continue
        pending.append(line)
        commands.append(CommandLine(start, "".join(pending)))
        pending = []
    if pending:  # the file ends inside a continuation: judge what is there
        commands.append(CommandLine(start, "".join(pending)))
    return commands


class Unreadable(ValueError):
    """A line check cannot read without running something."""


@dataclass
class Shell:
    """What bash knows while it reads the script: the variables it exports
    to commands (over this process's environment) and its own."""

    inherited: Mapping[str, str] = field(default_factory=lambda: dict(os.environ))
    exported: dict[str, str | None] = field(default_factory=dict)
    """Set or unset by the file (None: unset), over ``inherited``."""
    local: dict[str, str] = field(default_factory=dict)
    allexport: bool = False

    def value(self, name: str) -> str | None:
        if name in self.local:
            return self.local[name]
        if name in self.exported:
            return self.exported[name]
        return self.inherited.get(name)

    def is_exported(self, name: str) -> bool:
        if name in self.exported:
            return self.exported[name] is not None
        return name in self.inherited

    def assign(self, name: str, value: str, export: bool = False) -> None:
        if export or self.allexport or self.is_exported(name):
            self.exported[name] = value
            self.local.pop(name, None)
        else:
            self.local[name] = value

    def unset(self, name: str) -> None:
        self.local.pop(name, None)
        self.exported[name] = None

    def expand(self, text: str) -> str:
        """``$NAME`` and ``${NAME[:-default]}`` outside single quotes."""

        def one(match: re.Match[str]) -> str:
            if match["subst"]:
                raise Unreadable("it runs a command ($(...) or `...`); check runs none")
            name = match["braced"] or match["bare"]
            if name is None:  # an escape or a single-quoted span: as written
                return match[0]
            value = self.value(name)
            if match["op"] and (value is None or (match["op"] == ":-" and not value)):
                return match["default"]
            if value is None:
                raise Unreadable(f"${name} is set neither in the file nor here")
            return value

        return _EXPANSION.sub(one, text)


def _words(text: str) -> list[str]:
    # A redirection's fd is the digits written against it (2>&1, not -tp 4 >).
    text = _FD.sub("", text)
    lexer = shlex.shlex(text, posix=True, punctuation_chars=";&|<>()")
    lexer.whitespace_split = True
    try:
        return list(lexer)
    except ValueError as error:
        raise Unreadable(f"unreadable: {error}") from error


def _segments(words: list[str]) -> list[list[str]]:
    """Simple commands as bash runs them in turn: split at ``;``, ``&&``,
    ``||`` and ``&``; a pipeline's later commands, redirections and their
    targets left out."""
    segments: list[list[str]] = [[]]
    skip_to_separator = skip_next = False
    for word in words:
        if word in _SEPARATORS:
            segments.append([])
            skip_to_separator = skip_next = False
        elif skip_to_separator or skip_next:
            skip_next = False
        elif word == "|":
            skip_to_separator = True
        elif word[0] in "<>":
            skip_next = True  # the file or fd it redirects to
        elif word in "()":
            continue
        else:
            segments[-1].append(word)
    return [segment for segment in segments if segment]


def _assignment(word: str) -> tuple[str, str] | None:
    name, equals, value = word.partition("=")
    return (name, value) if equals and _NAME.match(name) else None


def _environment_builtin(words: list[str], shell: Shell) -> bool:
    """Apply ``export``/``declare -x``/``unset``/``set -a``/``VAR=value``;
    False where ``words`` is another command."""
    head, args = words[0], words[1:]
    if all(_assignment(word) for word in words):
        for word in words:
            shell.assign(*_assignment(word))  # type: ignore[misc]
        return True
    if head == "declare" and "-x" in args:
        head, args = "export", [arg for arg in args if arg != "-x"]
    if head == "export":
        unexport = "-n" in args
        for arg in (arg for arg in args if not arg.startswith("-")):
            pair = _assignment(arg)
            name, value = pair if pair else (arg, shell.value(arg))
            if unexport:
                shell.exported[name] = None
                if value is not None:
                    shell.local[name] = value
            elif value is not None:
                shell.assign(name, value, export=True)
        return True
    if head == "unset":
        for name in (arg for arg in args if not arg.startswith("-")):
            shell.unset(name)
        return True
    if head == "set":
        for arg in args:
            if arg.startswith(("-", "+")) and "a" in arg.lstrip("-+"):
                shell.allexport = arg.startswith("-")
        return True
    return False


def _serve(words: list[str], shell: Shell) -> Serve | NotServe:
    """A simple command's prefix assignments and ``env``/runner words, then
    either ``vllm serve`` or another command."""
    env: dict[str, str | None] = {}
    while words:
        pair = _assignment(words[0])
        if pair is not None:
            env[pair[0]] = pair[1]
            words = words[1:]
        elif words[0] in _RUNNERS:
            words = words[1:]
        elif words[0] == "env":
            words = words[1:]
            while words and words[0].startswith("-"):
                if words[0] in ("-u", "--unset") and len(words) > 1:
                    env[words[1]] = None
                    words = words[2:]
                elif words[0].startswith("--unset="):
                    env[words[0].split("=", 1)[1]] = None
                    words = words[1:]
                else:
                    raise Unreadable(f"env {words[0]}: check reads only -u here")
        else:
            break
    if tuple(os.path.basename(word) for word in words[:2]) != SERVE:
        return NotServe("not a vllm serve line")
    exported = {
        name: value
        for name, value in shell.exported.items()
        if name not in shell.inherited or shell.inherited[name] != value
    }
    unexported = tuple(
        name
        for name in shell.local
        if name.startswith("VLLM_") and name not in env and name not in exported
    )
    return Serve(words[2:], {**exported, **env}, unexported)


def read_script(text: str) -> list[tuple[CommandLine, Serve | NotServe]]:
    """Each command of ``text`` with what bash would run for it, in order;
    environment lines change what follows and get no entry of their own."""
    shell = Shell()
    entries: list[tuple[CommandLine, Serve | NotServe]] = []
    for command in command_lines(text):
        try:
            segments = _segments(_words(shell.expand(command.text)))
            for words in segments:
                if not _environment_builtin(words, shell):
                    entries.append((command, _serve(words, shell)))
        except Unreadable as error:
            named = "vllm" in command.text and "serve" in command.text
            entries.append((command, NotServe(str(error), may_be_serve=named)))
    return entries


def split_command(line: str) -> tuple[dict[str, str | None], list[str]]:
    """One ``vllm serve`` line's environment and argv (``vllm serve``
    dropped), read with nothing set before it; ValueError for any other line
    or one the shell could not split either."""
    entries = read_script(line)
    if len(entries) != 1 or not isinstance(entries[0][1], Serve):
        raise ValueError(entries[0][1].why if entries else "no command")
    return entries[0][1].env, entries[0][1].argv
