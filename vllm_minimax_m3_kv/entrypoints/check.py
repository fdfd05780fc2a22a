"""``vllm-minimax-m3-kv check``: will this MiniMax-M3 config start with one
KV precision?

Takes the flags ``vllm serve`` takes (parsed by vLLM's own parser) plus
``--target``, and answers on a machine without that GPU: vLLM's own config
validation runs with the plugin's hook judging for the target, so the live
hook and this command reach their verdict from the same function.

Everything this command can refuse on its own (``--help``, its own flags, a
model path that does not exist, a missing or unsupported vLLM) is answered
before vLLM is imported, in well under a second; a full verdict pays for
importing vLLM (10-20 s), because it is vLLM's own validation.

stdout is the plan; every refusal, with its fixes, and every warning go to
stderr. Exit 0: starts with one precision. 3: starts with a mixed pool the
operator opted into. 2: refused at startup. 1: this command's usage errors.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import difflib
import importlib.util
import json
import logging
import os
import shlex
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field, replace
from importlib import resources
from pathlib import Path
from typing import Any, ClassVar

from vllm_minimax_m3_kv import register
from vllm_minimax_m3_kv._versions import (
    SUPPORTED_VLLM_INSTALL,
    vllm_version_problem,
)
from vllm_minimax_m3_kv.config.facts import (
    HERE,
    TARGETS,
    is_minimax_m3,
    judging_for,
    target_platform_facts,
)
from vllm_minimax_m3_kv.config.indexer_precision import (
    AITER_ENV,
    ALLOW_MIXED_ENV,
    FP8_E4M3_KV_CACHE_DTYPES,
    SHUFFLE_KV_ENV,
    STOCK_INDEXER_DEFAULT,
    Fix,
    Outcome,
    PrecisionFacts,
    Verdict,
    bf16_pool_vllm_cannot_build,
    decide,
    facts_with_fix,
    stock_pool,
)
from vllm_minimax_m3_kv.entrypoints.check_commands import (
    EXIT_MIXED,
    EXIT_OK,
    EXIT_REFUSED,
    EXIT_USAGE,
    PROG,
    check_commands,
)
from vllm_minimax_m3_kv.entrypoints.fixed_commands import fixed_command
from vllm_minimax_m3_kv.entrypoints.serve_flags import mistyped_flag

ZEROER_NOT_BUILT = "not built"
ZEROER_HONOURED = (
    f"built and honoured on every worker and the scheduler ({ALLOW_MIXED_ENV}=1)"
)
ZEROER_REFUSED = "none: this configuration is refused at startup"
ZEROER_STOCK = (
    "built on every worker; the scheduler never asks it to zero (stock vLLM 0.33)"
)
PLUGIN_ENTRY_POINT = "minimax_m3_kv"
"""The plugin's name in ``vllm.general_plugins``, as ``VLLM_PLUGINS`` lists it."""
COMMANDS = ("check", "status", "selftest")
COMMON_GROUPS = (
    "ModelConfig",
    "CacheConfig",
    "ParallelConfig",
    "SchedulerConfig",
    "AttentionConfig",
    "VllmConfig",
)


BUNDLED_HUB_ID = "MiniMaxAI/MiniMax-M3"
"""The checkpoint whose architecture values the bundled config carries."""


def bundled_model_path() -> str:
    """A MiniMax-M3 config with the checkpoint's architecture values, no weights."""
    return str(resources.files("vllm_minimax_m3_kv") / "data" / "minimax_m3")


class _UsageError(Exception):
    pass


USAGE = f"{PROG} [MODEL] --target TARGET [--json] [--verbose] [vllm serve flags]"
DESCRIPTION = (
    "Preflight a MiniMax-M3 `vllm serve` command for KV precision, on any "
    "machine: no GPU, no weights, no network."
)
EPILOG = f"""\
MODEL is a local checkpoint directory or a Hugging Face id already in the
local cache (check never downloads); omitted, the bundled MiniMax-M3 config is
judged. Every other flag is a `vllm serve` flag, parsed by vLLM's own parser:
--help=GROUP lists a group's flags, --help=WORD the flags whose name holds
WORD, --help=all every flag (these import vLLM). Common groups:
{", ".join(COMMON_GROUPS)}. The indexer's dtype is a field of
--attention-config (in VllmConfig): --help=attention-config shows it, and
--attention-config.indexer_kv_dtype fp8 sets it.

With VLLM_PLUGINS set and minimax_m3_kv not in it, the plan is stock vLLM
0.33's, as `vllm serve` would run it.

exit codes: 0 starts with one precision; 3 starts with a mixed pool: one you
opted into (VLLM_MINIMAX_M3_KV_ALLOW_MIXED=1), or stock vLLM's (VLLM_PLUGINS
leaves the plugin out; the plan's first row says so); 2 refused at startup (the
reason and its fixes on stderr); 1 usage error. --json also carries the fixes,
one object each, and both versions.
"""
VERBOSE_FLAG = "--verbose"
JSON_FLAG = "--json"
_CHECK_SECTION = "check options"


def _target(value: str) -> str:
    """A ``--target`` value, in any case; a near miss gets its nearest name."""
    target = value.lower()
    names = (*TARGETS, HERE)
    if target in names:
        return target
    nearest = difflib.get_close_matches(target, names, n=1, cutoff=0.6)
    hint = f" (did you mean {nearest[0]}?)" if nearest else ""
    raise argparse.ArgumentTypeError(
        f"unknown target {value!r}{hint}; one of: {', '.join(names)}"
    )


def _add_own_arguments(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    """This command's own flags, for its fast parser and vLLM's alike."""
    group = parser.add_argument_group(_CHECK_SECTION)
    return [
        group.add_argument(
            "--target",
            type=_target,
            metavar="{" + ",".join((*TARGETS, HERE)) + "}",
            # Required, but checked by hand: argparse would print "(default:
            # None)" in vLLM's help, and this way the message names them all.
            default=argparse.SUPPRESS,
            help="GPU to judge for (required): a name simulates that GPU "
            "(a ROCm one as a ROCm vLLM image with aiter and its MSA kernels); "
            f"'{HERE}' judges this machine's own GPU, aiter and vLLM (a "
            "container entrypoint's gate). VLLM_ROCM_* and "
            f"{ALLOW_MIXED_ENV} are read from the environment.",
        ),
        group.add_argument(
            JSON_FLAG, action="store_true", help="Print the plan as one JSON object."
        ),
        group.add_argument(
            "--commands",
            metavar="FILE",
            help="Judge every `vllm serve` command in FILE, as a shell reads "
            "it (backslash continues a line; # comments; leading VAR=value "
            "words are its environment), and print one row each, with each "
            "refusal's fixes; exit with the worst verdict (2 refused, 3 mixed), "
            "or 4 if every judged line starts uniform but some line could not "
            "be judged.",
        ),
        group.add_argument(
            VERBOSE_FLAG,
            action="store_true",
            help="Show vLLM's own import and config logs (hidden by default).",
        ),
    ]


class _OwnParser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        # argparse exits 2 on bad flags; 2 means "refused" here.
        raise _UsageError(message)


def own_flag_names() -> frozenset[str]:
    """The long flags check adds to vLLM's serve parser, read from the parser
    that adds them (so the shipped list of vLLM's flags never holds them)."""
    scratch = argparse.ArgumentParser(add_help=False)
    return frozenset(
        option
        for action in _add_own_arguments(scratch)
        for option in action.option_strings
        if option.startswith("--")
    )


def own_parser() -> argparse.ArgumentParser:
    """check's own flags, parsed without vLLM (the rest are left over)."""
    parser = _OwnParser(
        prog=PROG,
        usage=USAGE,
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        add_help=False,
        allow_abbrev=False,
    )
    _add_own_arguments(parser)
    parser.add_argument(
        "-h",
        "--help",
        nargs="?",
        const=True,
        default=False,
        metavar="GROUP",
        help="This help; --help=GROUP for `vllm serve` flags.",
    )
    parser.add_argument(
        "--version",
        action="store_true",
        help="The plugin's and the installed vLLM's versions.",
    )
    return parser


def versions_line() -> str:
    """Both versions, from package metadata (vLLM is not imported)."""
    from importlib import metadata

    def version(name: str, missing: str) -> str:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            return missing

    from vllm_minimax_m3_kv.entrypoints.status import identity

    vllm = version("vllm", "not installed")
    return f"vllm-minimax-m3-kv {identity()}; vLLM {vllm}"


def plugin_excluded() -> bool:
    """Whether ``VLLM_PLUGINS`` leaves this plugin out, as vLLM reads it."""
    allowed = os.environ.get("VLLM_PLUGINS")
    return allowed is not None and PLUGIN_ENTRY_POINT not in allowed.split(",")


def build_parser() -> argparse.ArgumentParser:
    """The full parser: vLLM's ``vllm serve`` parser with check's flags first."""
    from vllm.entrypoints.common.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    class CheckParser(FlexibleArgumentParser):
        check_actions: ClassVar[list[argparse.Action]] = []

        def error(self, message: str) -> None:  # type: ignore[override]
            raise _UsageError(message)

        def format_help(self) -> str:
            # vLLM's help lists config groups only; this command's own flags
            # go first, in full.
            full = super().format_help()
            if self._search_keyword is not None:
                return full
            formatter = self._get_formatter()
            formatter.start_section(_CHECK_SECTION)
            formatter.add_arguments(self.check_actions)
            formatter.end_section()
            own = formatter.format_help()
            head, marker, rest = full.partition("Config Groups:")
            return head + own + "\n" + marker + rest if marker else own + full

    parser = make_arg_parser(
        CheckParser(prog=PROG, description=DESCRIPTION, usage=USAGE)
    )
    CheckParser.check_actions = _add_own_arguments(parser)
    return parser


@dataclass(frozen=True)
class _OwnArgs:
    target: str | None
    help: bool | str
    model: str | None
    version: bool = False
    commands: str | None = None
    bundled_for: str | None = None
    """A hub id not in the local cache whose bundled config is judged."""


def _flag_value(rest: list[str], *names: str) -> str | None:
    """The last value given for a flag, in any spelling vLLM's parser takes
    (``--a-b v``, ``--a_b v``, ``--a-b=v``)."""
    spellings = set(names)
    spellings |= {"--" + n[2:].replace("-", "_") for n in names if n[:2] == "--"}
    value = None
    for index, word in enumerate(rest):
        name, equals, given = word.partition("=")
        if name in spellings:
            if equals:
                value = given
            elif index + 1 < len(rest):
                value = rest[index + 1]
    return value


def vllm_kv_cache_dtypes() -> tuple[str, ...] | None:
    """``--kv-cache-dtype``'s choices, read from the installed vLLM's source
    (``CacheDType`` in ``vllm/config/cache.py``) without importing it; None
    when they cannot be read, and vLLM's own parser answers."""
    return _literal_of_vllm("cache.py", "CacheDType")


def vllm_indexer_kv_dtypes() -> tuple[str, ...] | None:
    """``indexer_kv_dtype``'s named values (``IndexerKVDType`` in
    ``vllm/config/attention.py``), and ``fp8_e4m3``, the spelling MiniMax-M3's
    index cache also takes; vLLM types the field ``IndexerKVDType | str``, so
    nothing else is refused before model build."""
    named = _literal_of_vllm("attention.py", "IndexerKVDType")
    return None if named is None else (*named, "fp8_e4m3")


def _literal_of_vllm(module: str, name: str) -> tuple[str, ...] | None:
    """A ``Name = Literal[...]`` of ``vllm/config/<module>``, read, not imported."""
    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        return None
    source = Path(next(iter(spec.submodule_search_locations)), "config", module)
    try:
        tree = ast.parse(source.read_text(encoding="utf-8"))
    except (OSError, SyntaxError):
        return None
    for node in tree.body:
        if (
            isinstance(node, ast.Assign)
            and any(getattr(t, "id", None) == name for t in node.targets)
            and isinstance(node.value, ast.Subscript)
            and isinstance(node.value.slice, ast.Tuple)
        ):
            return tuple(
                e.value
                for e in node.value.slice.elts
                if isinstance(e, ast.Constant) and isinstance(e.value, str)
            )
    return None


def _config_heads(model: str | None) -> int | None:
    """The checkpoint's attention heads, from its config.json (no vLLM)."""
    folder = Path(model) if model is not None else Path(bundled_model_path())
    try:
        config = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError):
        return None
    heads = config.get("text_config", config).get("num_attention_heads")
    return heads if isinstance(heads, int) and heads > 0 else None


def known_bad_flag(rest: list[str], model: str | None) -> str | None:
    """A value of a flag the verdict reads that vLLM is known to refuse, with
    the nearest valid value; None when vLLM's own parser should answer."""
    kv = _flag_value(rest, "--kv-cache-dtype")
    choices = vllm_kv_cache_dtypes()
    if kv is not None and choices and kv not in choices:
        nearest = difflib.get_close_matches(kv, choices, n=1, cutoff=0.5)
        hint = f"did you mean {nearest[0]}? " if nearest else ""
        return (
            f"--kv-cache-dtype {kv!r} is not one vLLM takes; {hint}valid: "
            f"{', '.join(choices)}"
        )
    indexer = _flag_value(rest, "--attention-config.indexer_kv_dtype")
    attention_json = _flag_value(rest, "--attention-config", "-ac")
    if indexer is None and attention_json and attention_json.lstrip().startswith("{"):
        with contextlib.suppress(ValueError, AttributeError):
            indexer = json.loads(attention_json).get("indexer_kv_dtype")
    indexers = vllm_indexer_kv_dtypes()
    if isinstance(indexer, str) and indexers and indexer not in indexers:
        nearest = difflib.get_close_matches(indexer, indexers, n=1, cutoff=0.5)
        hint = f"did you mean {nearest[0]}? " if nearest else ""
        return (
            f"--attention-config.indexer_kv_dtype {indexer!r} is no indexer dtype "
            f"vLLM names; {hint}valid: {', '.join(indexers)}"
        )
    tp = _flag_value(rest, "--tensor-parallel-size", "-tp")
    heads = _config_heads(model)
    if tp is not None and heads is not None:
        try:
            size = int(tp)
        except ValueError:
            return None  # vLLM's parser names the type
        if size > 0 and heads % size:
            valid = [n for n in range(1, heads + 1) if heads % n == 0]
            return (
                f"--tensor-parallel-size {size} does not divide this model's "
                f"{heads} attention heads, which vLLM requires; valid sizes: "
                f"{', '.join(map(str, valid))}"
            )
    return None


def _model_argument(rest: list[str]) -> str | None:
    """The model a ``vllm serve`` command names: its first positional, or
    ``--model``."""
    if rest and not rest[0].startswith("-"):
        return rest[0]
    for index, word in enumerate(rest):
        if word == "--model" and index + 1 < len(rest):
            return rest[index + 1]
        if word.startswith("--model="):
            return word.split("=", 1)[1]
    return None


def _in_local_hub_cache(model: str) -> bool:
    from huggingface_hub import constants

    folder = Path(constants.HF_HUB_CACHE, "models--" + model.replace("/", "--"))
    return any(folder.glob("snapshots/*/config.json"))


def _offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").upper() in ("1", "ON", "YES", "TRUE")


def unreadable_model_message(model: str) -> str:
    return (
        f"cannot read the model config for {model!r}: it is not a local "
        "directory, and check does not download (HF_HUB_OFFLINE=1 unless you "
        "set it). Pass a local checkpoint directory, or omit the model to judge "
        f"the bundled {BUNDLED_HUB_ID} config. A quantized checkpoint (MXFP8, "
        "MXFP4, FP8-KV) carries a quantization config that can set the KV cache "
        "dtype: judge its own local directory."
    )


def _without_model(argv: list[str], model: str) -> list[str]:
    """``argv`` without the model it names (positional or ``--model``)."""
    out, skip = [], False
    for index, word in enumerate(argv):
        if skip:
            skip = False
            continue
        # The positional, wherever it stands: not the value of another flag
        # (--served-model-name MiniMaxAI/MiniMax-M3 stays).
        previous = argv[index - 1] if index else ""
        if word == model and (
            previous in ("", "--model") or not previous.startswith("-")
        ):
            continue
        if word == "--model" and index + 1 < len(argv) and argv[index + 1] == model:
            skip = True
            continue
        if word == f"--model={model}":
            continue
        out.append(word)
    return out


def judge_without_vllm(argv: list[str]) -> _OwnArgs:
    """Everything check can answer before importing vLLM, or _UsageError."""
    own, rest = own_parser().parse_known_args(argv)
    if own.version:
        return _OwnArgs(None, False, None, version=True)
    if own.help is not False:
        if own.help is not True and (problem := vllm_version_problem()) is not None:
            # --help=GROUP is vLLM's own help: it needs vLLM.
            raise _UsageError(f"--help={own.help}: {problem}. {SUPPORTED_VLLM_INSTALL}")
        return _OwnArgs(None, own.help, None)
    target = getattr(own, "target", None)
    if target is None:
        raise _UsageError(
            f"the following argument is required: --target (one of: "
            f"{', '.join(TARGETS)}; or {HERE}, this machine)"
        )
    if own.commands is not None:
        if not Path(own.commands).is_file():
            raise _UsageError(f"--commands {own.commands}: no such file")
        return _OwnArgs(target, False, None, commands=own.commands)
    model = _model_argument(rest)
    bundled_for = None
    if (
        model is not None
        and not Path(model).is_dir()
        and _offline()
        and not _in_local_hub_cache(model)
    ):
        if model != BUNDLED_HUB_ID:
            raise _UsageError(unreadable_model_message(model))
        # As the launch scripts do: the bundled config is that checkpoint's.
        bundled_for, model = model, None
    if (problem := vllm_version_problem()) is not None:
        raise _UsageError(f"{problem}. {SUPPORTED_VLLM_INSTALL}")
    own_flags = [
        option for action in own_parser()._actions for option in action.option_strings
    ]
    if (typo := mistyped_flag(rest, own_flags)) is not None:
        raise _UsageError(f"vLLM takes no flag {typo}")
    if (bad := known_bad_flag(rest, model)) is not None:
        raise _UsageError(f"vLLM refuses these flags: {bad}")
    return _OwnArgs(target, False, model, bundled_for=bundled_for)


def vllm_help(parser: argparse.ArgumentParser, keyword: str) -> str:
    """vLLM's own ``--help=KEYWORD`` text, or _UsageError when nothing in
    ``vllm serve`` matches it (vLLM itself prints a note and exits 0)."""
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    FlexibleArgumentParser._search_keyword = keyword.lower()
    try:
        text = parser.format_help()
    finally:
        FlexibleArgumentParser._search_keyword = None
    if "No group or arguments matching" in text:
        raise _UsageError(
            f"--help={keyword}: no `vllm serve` flag group or flag matches it; "
            f"groups include {', '.join(COMMON_GROUPS)} (--help=all lists every flag)"
        )
    if keyword.lower() == "attentionconfig":
        text += (
            "\nThe indexer's dtype is a field of --attention-config (VllmConfig "
            "group): --help=attention-config shows it; set it with "
            "--attention-config.indexer_kv_dtype fp8.\n"
        )
    return text


@contextlib.contextmanager
def _quiet_stderr(quiet: bool) -> Iterator[None]:
    """Hide vLLM's and torch's import noise; replay it if something breaks.

    At the file-descriptor level: some of it is printed by C extensions.
    """
    if not quiet:
        yield
        return
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as sink:
        os.dup2(sink.fileno(), 2)
        failed = True
        try:
            yield
            failed = False
        except SystemExit as done:  # --help, --version: a normal end
            failed = done.code not in (0, None)
            raise
        except _UsageError:  # says everything in one line of its own
            failed = False
            raise
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            if failed:
                sink.seek(0)
                sys.stderr.write(sink.read()[-8000:].decode(errors="replace"))


@dataclass(frozen=True)
class Plan:
    architecture: str
    target: str
    kv_cache_dtype: str
    indexer_kv_dtype: str
    indexer_inherited: bool
    uniform_precision: bool
    kv_block_zeroer: str
    tensor_parallel_size: int
    bytes_per_token_main: int
    bytes_per_token_indexer: int
    bytes_per_token_total: int
    stock_bytes_per_token_total: int
    token_capacity_vs_stock: float
    outcome: str
    message: str
    notes: list[str]
    plugin: str = "on"
    executor_note: str = ""
    kv_cache_dtype_source: str = "--kv-cache-dtype"
    """Where the main KV dtype came from: the flag, or the checkpoint."""
    not_judged: str = ""
    """Flags of the command this check set aside, and why."""
    model_note: str = ""
    fixes: list[dict[str, Any]] = field(default_factory=list)
    """Each fix of a refusal: ``line`` (what pastes into a shell), ``env``,
    ``flags``, ``remove`` (flags to drop), ``requires`` (software)."""
    versions: str = ""
    fp8_indexer: str = ""
    """Which indexer runs the fp8 index cache, where the platform has two
    (ROCm: vLLM's Triton indexer or the AITER MSA indexer)."""
    model_dtype: str = ""
    """What ``--kv-cache-dtype auto`` stores: the model's dtype (for the row)."""
    fp8_format: str = ""
    """The e4m3 flavour of an fp8 cache where it is not OCP e4m3fn (gfx942:
    e4m3fnuz), so the plan says which bytes the pool holds."""

    def render(self) -> str:
        rows = [("plugin", self.plugin)] if self.plugin != "on" else []
        if self.model_note:
            rows.append(("model", self.model_note))
        rows += [
            ("architecture", self.architecture),
            ("target", self.target),
            ("main KV dtype", self._main_row()),
            ("indexer dtype", self._indexer_row()),
            ("uniform precision", "yes" if self.uniform_precision else "no"),
            ("KV block zeroer", self.kv_block_zeroer),
            (
                f"bytes/token @TP{self.tensor_parallel_size}",
                f"main {self.bytes_per_token_main:,} + indexer "
                f"{self.bytes_per_token_indexer:,} = {self.bytes_per_token_total:,}",
            ),
            (
                "token capacity vs stock",
                f"{self.token_capacity_vs_stock:.2f}x (stock vLLM 0.33 running "
                f"this command: {self.stock_bytes_per_token_total:,} bytes/token)",
            ),
        ]
        if self.executor_note:
            rows.append(("executor backend", self.executor_note))
        if self.not_judged:
            rows.append(("not judged", self.not_judged))
        width = max(len(name) for name, _ in rows)
        return "\n".join(f"{name:<{width}}  {value}" for name, value in rows)

    def _main_row(self) -> str:
        if self.kv_cache_dtype == "auto" and self.model_dtype:
            # Say what "auto" stores: bf16 for MiniMax-M3's bf16 weights.
            stored = {"bfloat16": "bf16"}.get(self.model_dtype, self.model_dtype)
            return f"{stored} (auto: the model's dtype)"
        said = [
            self.fp8_format if self.kv_cache_dtype in FP8_E4M3_KV_CACHE_DTYPES else "",
            ""
            if self.kv_cache_dtype_source == "--kv-cache-dtype"
            else self.kv_cache_dtype_source,
        ]
        said = [part for part in said if part]
        return self.kv_cache_dtype + (f" ({'; '.join(said)})" if said else "")

    def _indexer_row(self) -> str:
        said = [
            self.fp8_format
            if self.indexer_kv_dtype in FP8_E4M3_KV_CACHE_DTYPES
            else "",
            "inherited from the KV cache" if self.indexer_inherited else "",
            self.fp8_indexer,
        ]
        said = [part for part in said if part]
        return self.indexer_kv_dtype + (f" ({'; '.join(said)})" if said else "")

    @property
    def exit_code(self) -> int:
        if self.outcome == Outcome.ERROR.value:
            return EXIT_REFUSED
        return EXIT_MIXED if self.outcome == Outcome.MIXED.value else EXIT_OK


def plan_for(args: argparse.Namespace) -> Plan:
    """Judge parsed ``vllm serve`` arguments for ``args.target``."""
    from vllm.engine.arg_utils import EngineArgs

    from vllm_minimax_m3_kv.config.kv_bytes import kv_bytes_per_token

    if args.model_tag is not None:
        args.model = args.model_tag
    not_judged = ""
    if args.model == EngineArgs.model:  # no model given: the bundled config
        args.model = bundled_model_path()
        args.skip_tokenizer_init = True
        if args.reasoning_parser:
            # vLLM builds the parser from the checkpoint's tokenizer, which
            # the bundled config lacks; it does not touch the KV pool.
            not_judged = (
                f"--reasoning-parser {args.reasoning_parser} (it needs the "
                "checkpoint's tokenizer, which the bundled config lacks; it "
                "does not change the KV pool)"
            )
            args.reasoning_parser = ""
    try:
        # EngineArgs resolves a hub id to a local snapshot on construction.
        engine_args = EngineArgs.from_cli_args(args)
        model_config = engine_args.create_model_config()
    except Exception as error:  # unreadable model: this command's usage error
        raise _UsageError(_unreadable_model(args.model, error)) from error
    if not is_minimax_m3(model_config):
        raise _UsageError(
            f"{model_config.architecture} is not a MiniMax-M3 architecture; "
            "this check only judges MiniMax-M3."
        )
    executor_note = _without_ray_if_absent(engine_args)
    # The facts come from the plugin's hook inside vLLM's own validation,
    # whatever VLLM_PLUGINS says; with the plugin left out, stock's plan.
    register()
    facts, verdict = _judge_like_vllm_serve(
        engine_args, args.target, quiet=not args.verbose
    )
    if plugin_excluded():
        return replace(
            _stock_plan(model_config, facts, args.target, executor_note),
            not_judged=not_judged,
        )
    # The plugin leaves bf16 pools to vLLM; check still says when vLLM will
    # fail to build one, since it promises what `vllm serve` does.
    unbuildable = (
        bf16_pool_vllm_cannot_build(facts)
        if verdict.outcome is Outcome.UNCHANGED
        else None
    )
    verdict = unbuildable or verdict
    resolved = verdict.indexer_kv_dtype
    tp = facts.tensor_parallel_size
    sizes = {
        "model_config": model_config,
        "kv_cache_dtype": facts.kv_cache_dtype,
        "tensor_parallel_size": tp,
        "unquantized_layers": len(facts.unquantized_dense_layers),
    }
    ours = kv_bytes_per_token(**sizes, indexer_kv_dtype=resolved)
    requested = facts.indexer_kv_dtype
    stock = kv_bytes_per_token(
        **sizes,
        indexer_kv_dtype=STOCK_INDEXER_DEFAULT if requested == "auto" else requested,
    )

    def capacity(fix: Fix) -> float:
        """KV tokens with ``fix`` applied, against stock running this command."""
        after = facts_with_fix(facts, fix)
        indexer = decide(after).indexer_kv_dtype
        with_fix = kv_bytes_per_token(
            model_config=model_config,
            kv_cache_dtype=after.kv_cache_dtype,
            tensor_parallel_size=after.tensor_parallel_size,
            unquantized_layers=len(after.unquantized_dense_layers),
            indexer_kv_dtype=STOCK_INDEXER_DEFAULT if indexer == "auto" else indexer,
        )
        return round(stock.total / with_fix.total, 4)

    # Both caches bf16 (unchanged) is uniform too, even where vLLM cannot
    # build it; only MIXED and the plugin's refusals are not.
    uniform = unbuildable is not None or verdict.outcome not in (
        Outcome.MIXED,
        Outcome.ERROR,
    )
    zeroer = {
        Outcome.ERROR: ZEROER_REFUSED,
        Outcome.MIXED: ZEROER_HONOURED,
    }.get(verdict.outcome, ZEROER_NOT_BUILT)
    return Plan(
        architecture=model_config.architecture,
        target=_target_row(args.target, facts),
        kv_cache_dtype=facts.kv_cache_dtype,
        indexer_kv_dtype=resolved if resolved != "auto" else STOCK_INDEXER_DEFAULT,
        indexer_inherited=resolved != requested,
        uniform_precision=uniform,
        kv_block_zeroer=zeroer,
        tensor_parallel_size=tp,
        bytes_per_token_main=ours.main,
        bytes_per_token_indexer=ours.indexer,
        bytes_per_token_total=ours.total,
        stock_bytes_per_token_total=stock.total,
        token_capacity_vs_stock=round(stock.total / ours.total, 4),
        outcome=verdict.outcome.value,
        message=verdict.message,
        notes=list(verdict.notes),
        executor_note=executor_note,
        kv_cache_dtype_source=_kv_source(facts),
        not_judged=not_judged,
        fixes=[
            {**fix_as_json(fix), "token_capacity_vs_stock": capacity(fix)}
            for fix in verdict.fixes
        ],
        versions=versions_line(),
        fp8_indexer=verdict.fp8_indexer or "",
        fp8_format=_fp8_format(facts),
        model_dtype=facts.model_dtype,
    )


def _fp8_format(facts: PrecisionFacts) -> str:
    fp8_format = facts.platform.fp8_e4m3_format
    return "" if fp8_format == "e4m3fn" else fp8_format


FIXED_COMMANDS_HEADING = "The same command with each fix applied, as it runs:"
"""Printed after a refusal's fixes, before each whole fixed command."""
_COMMAND_ENV = (AITER_ENV, SHUFFLE_KV_ENV, ALLOW_MIXED_ENV)
"""The variables check reads: a fixed command carries the ones that are set."""


def _with_fixed_commands(
    plan: Plan, argv: list[str], parser: argparse.ArgumentParser
) -> None:
    """Give each fix of ``plan`` its ``command``: the user's own ``vllm
    serve`` command (check's flags left out) with that fix applied."""
    if not plan.fixes:
        return
    _, serve_words = own_parser().parse_known_args(argv)
    if _model_argument(serve_words) is None:
        # The bundled config stands for the published checkpoint.
        serve_words = [BUNDLED_HUB_ID, *serve_words]
    env = {name: os.environ[name] for name in _COMMAND_ENV if name in os.environ}
    table = parser._option_string_actions

    def arity(flag: str) -> int | None:
        action = table.get(flag)
        nargs = None if action is None else action.nargs
        if action is None or nargs is None:
            return 1
        return nargs if isinstance(nargs, int) else None

    for fix in plan.fixes:
        fix["command"] = fixed_command(serve_words, env, fix, arity)


def fix_as_json(fix: Fix) -> dict[str, Any]:
    return {
        "line": fix.render(),
        "summary": fix.summary,
        "env": dict(fix.env),
        "flags": [list(pair) for pair in fix.flags],
        "remove": list(fix.without),
        "requires": list(fix.requires),
    }


def _target_row(target: str, facts: PrecisionFacts) -> str:
    name = facts.platform.name if target == HERE else target_platform_facts(target).name
    if target == HERE and facts.platform.vendor == "rocm":
        aiter = (
            "aiter with the MSA kernels"
            if facts.platform.aiter_msa_kernels
            else "aiter without the MSA kernels"
            if facts.platform.aiter_installed
            else "no aiter"
        )
        name = f"{name}, {aiter}"
    return f"{target} ({name})"


def judges_this_machine(argv: list[str]) -> bool:
    """``--target here`` in any case, as check's parser reads it (``str.lower``)."""
    target = _flag_value(argv, "--target")
    return target is not None and target.lower() == HERE


def _require_a_gpu_here() -> None:
    from vllm.platforms import current_platform

    if not (current_platform.is_rocm() or current_platform.is_cuda()):
        raise _UsageError(
            f"--target {HERE}: vLLM finds no CUDA or ROCm GPU on this machine; "
            f"run it on the serving node, or name the GPU to judge for, e.g. "
            f"--target mi355x ({', '.join(TARGETS)})"
        )


def _kv_source(facts: PrecisionFacts) -> str:
    if not facts.kv_from_checkpoint:
        return "--kv-cache-dtype"
    return f"from the checkpoint's {facts.kv_cache_source}"


def _stock_kv_source(facts: PrecisionFacts) -> str:
    # Stock vLLM applies a compressed-tensors declaration only at model build
    # (Attention.__init__), and only to the layers built after a dense one.
    source = _kv_source(facts)
    if facts.kv_from_checkpoint and facts.kv_cache_flag == "auto":
        return f"{source}, applied by stock vLLM only at model build"
    return source


def _without_ray_if_absent(engine_args: Any) -> str:
    """The KV pool does not depend on the executor backend, so a Ray layout
    is judged on a machine without Ray; the plan says so."""
    if engine_args.distributed_executor_backend != "ray":
        return ""
    if importlib.util.find_spec("ray") is not None:
        return "ray"
    engine_args.distributed_executor_backend = "mp"
    return "ray (not installed here, not imported: the KV pool does not depend on it)"


def _stock_plan(
    model_config: Any, facts: PrecisionFacts, target: str, executor_note: str
) -> Plan:
    """What ``vllm serve`` runs with this plugin left out by VLLM_PLUGINS."""
    from vllm_minimax_m3_kv.config.kv_bytes import kv_bytes_per_token

    stock = stock_pool(facts)
    sizes = kv_bytes_per_token(
        model_config=model_config,
        kv_cache_dtype=facts.kv_cache_dtype,
        tensor_parallel_size=facts.tensor_parallel_size,
        unquantized_layers=len(facts.unquantized_dense_layers),
        indexer_kv_dtype=stock.indexer_kv_dtype,
    )
    return Plan(
        architecture=model_config.architecture,
        target=_target_row(target, facts),
        kv_cache_dtype=facts.kv_cache_dtype,
        indexer_kv_dtype=stock.indexer_kv_dtype,
        indexer_inherited=False,
        uniform_precision=stock.uniform,
        kv_block_zeroer=ZEROER_NOT_BUILT if stock.uniform else ZEROER_STOCK,
        tensor_parallel_size=facts.tensor_parallel_size,
        bytes_per_token_main=sizes.main,
        bytes_per_token_indexer=sizes.indexer,
        bytes_per_token_total=sizes.total,
        stock_bytes_per_token_total=sizes.total,
        token_capacity_vs_stock=1.0,
        outcome=(Outcome.UNCHANGED if stock.uniform else Outcome.MIXED).value,
        message=(
            "stock vLLM 0.33 runs a mixed KV pool here: vllm-minimax-m3-kv is "
            f"off (VLLM_PLUGINS={shlex.quote(os.environ.get('VLLM_PLUGINS', ''))})"
        ),
        notes=[],
        versions=versions_line(),
        kv_cache_dtype_source=_stock_kv_source(facts),
        plugin=(
            "off: VLLM_PLUGINS leaves out minimax_m3_kv; this is stock vLLM 0.33's plan"
        ),
        executor_note=executor_note,
        fp8_format=_fp8_format(facts),
        model_dtype=facts.model_dtype,
    )


def _judge_like_vllm_serve(
    engine_args: Any, target: str, quiet: bool
) -> tuple[PrecisionFacts, Verdict]:
    """vLLM's own config validation for these flags, as ``vllm serve`` runs
    it, with the plugin's hook judging for ``target``: its verdict (from the
    config vLLM resolved, skip layers it adds included) is the answer. A
    refusal by vLLM itself (dtype names, TP that does not divide the heads,
    lengths) is this command's usage error, in vLLM's own words.
    """
    from vllm_minimax_m3_kv.model_executor.models.config import (
        IndexerPrecisionError,
    )

    # vLLM configures its logging (to stdout) while it builds the config;
    # this command's stdout is the plan, so its INFO lines stay out.
    if quiet:
        logging.disable(logging.WARNING)
    try:
        with judging_for(target) as judgement, _native_decision_stands_aside():
            try:
                replace(engine_args).create_engine_config()
            except Exception as error:
                cause = validation_cause(error)
                if not isinstance(cause, IndexerPrecisionError):
                    raise _UsageError(
                        f"vLLM refuses these flags: {_validation_words(error)}"
                    ) from error
    finally:
        logging.disable(logging.NOTSET)
    if judgement.facts is None or judgement.verdict is None:
        raise _UsageError(
            "vLLM accepted these flags without running the MiniMax-M3 hook; "
            "is vllm-minimax-m3-kv excluded by VLLM_PLUGINS?"
        )
    return judgement.facts, judgement.verdict


@contextlib.contextmanager
def _native_decision_stands_aside() -> Iterator[None]:
    """On a vLLM that carries upstream PR 1 (``upstream/``), its own
    MiniMax-M3 hook would judge this CPU rather than the target. For this one
    offline validation it stands aside, and the plugin's hook, which wraps
    vLLM's entry and runs after it, judges for the target under
    ``judging_for`` as on stock vLLM; the rest of vLLM's validation runs as
    usual. Restored on exit; never used when serving."""
    from vllm_minimax_m3_kv.patches import (
        MODELS_CONFIG_MODULE,
        NATIVE_HOOK_CLASS,
        native_hook_in_vllm,
    )

    if native_hook_in_vllm() is None:
        yield
        return
    import importlib

    native = getattr(importlib.import_module(MODELS_CONFIG_MODULE), NATIVE_HOOK_CLASS)
    own = native.__dict__["verify_and_update_config"]
    native.verify_and_update_config = staticmethod(lambda vllm_config: None)
    try:
        yield
    finally:
        native.verify_and_update_config = own


def _validation_words(error: BaseException) -> str:
    """vLLM's refusal in one line: the validator's message, or for a field
    constraint pydantic's own field and words (not "1 validation error")."""
    cause = validation_cause(error)
    if cause is not error:
        return _first_line(cause)
    errors = getattr(error, "errors", None)
    if callable(errors):
        with contextlib.suppress(Exception):
            first = errors()[0]
            where = ".".join(str(part) for part in first.get("loc", ()))
            title = getattr(error, "title", "")
            field = f"{title}.{where}" if title and where else where or title
            return f"{field}: {first['msg']}" if field else str(first["msg"])
    return _first_line(error)


def _first_line(error: BaseException) -> str:
    return (str(error).strip().splitlines() or [type(error).__name__])[0]


def validation_cause(error: BaseException) -> BaseException:
    """The exception a config validator raised, out of pydantic's wrapper."""
    errors = getattr(error, "errors", None)
    if callable(errors):
        with contextlib.suppress(Exception):
            inner = errors()[0].get("ctx", {}).get("error")
            if isinstance(inner, BaseException):
                return inner
    return error


def _unreadable_model(model: str, error: Exception) -> str:
    if Path(model).is_dir():  # read, and refused by vLLM's own validation
        return f"vLLM refuses these flags: {_first_line(validation_cause(error))}"
    return unreadable_model_message(model)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["status"]:
        # About this node, not a target: no CPU platform, no offline default.
        from vllm_minimax_m3_kv.entrypoints.status import main as status

        return status()
    if argv[:1] == ["selftest"]:
        # On this node's GPU, with its own vLLM platform: no offline target.
        from vllm_minimax_m3_kv.selftest import main as selftest

        return selftest(argv[1:])
    # A named target's verdict is never for this machine: vLLM's CPU platform
    # lets its serve parser build anywhere, GPU or not, and the same way.
    # --target here is judged on the platform vLLM detects.
    if not judges_this_machine(argv):
        os.environ["VLLM_TARGET_DEVICE"] = "cpu"
    # A preflight reads configs it has; a hub id it lacks fails at once
    # rather than retrying for minutes on a machine without network.
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    # stdout is the plan (or its JSON); vLLM's own logs, shown with
    # --verbose, go to stderr.
    os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")
    try:
        argv = _without_command(argv)
        early = judge_without_vllm(argv)
        if early.version:
            print(versions_line())
            return EXIT_OK
        if early.help is True:
            print(own_parser().format_help(), end="")
            return EXIT_OK
        if early.commands is not None:
            assert early.target is not None
            return check_commands(
                Path(early.commands),
                early.target,
                judge=main,
                as_json=JSON_FLAG in argv,
            )
        with _quiet_stderr(VERBOSE_FLAG not in argv):
            if early.target == HERE:
                # Before vLLM's parser, which cannot be built without a device.
                _require_a_gpu_here()
            parser = build_parser()
            if early.help is not False:
                print(vllm_help(parser, str(early.help)), end="")
                return EXIT_OK
            if early.bundled_for is not None:
                argv = _without_model(argv, early.bundled_for)
            args = parser.parse_args(argv)
            plan = plan_for(args)
            _with_fixed_commands(plan, argv, parser)
            if early.bundled_for is not None:
                plan = replace(
                    plan,
                    model_note=f"{early.bundled_for} is not in the local cache: the "
                    "bundled config of that checkpoint is judged (its architecture "
                    "values, no weights)",
                )
    except _UsageError as error:
        print(f"{PROG}: {error}", file=sys.stderr)
        return EXIT_USAGE
    if args.json:
        print(json.dumps(asdict(plan), indent=2))
    else:
        print(plan.render())
    if plan.outcome == Outcome.ERROR.value:
        print(plan.message, file=sys.stderr)
        commands = [fix["command"] for fix in plan.fixes if "command" in fix]
        if commands:
            print(FIXED_COMMANDS_HEADING, file=sys.stderr)
            for command in commands:
                print(f"  {command}", file=sys.stderr)
    elif plan.outcome == Outcome.MIXED.value:
        print(f"warning: {plan.message}", file=sys.stderr)
    for note in plan.notes:
        print(f"warning: {note}", file=sys.stderr)
    return plan.exit_code


def _without_command(argv: list[str]) -> list[str]:
    """``vllm-minimax-m3-kv [check] ...``: drop the command; a first word that
    is neither a command nor a model path is a mistyped command."""
    if not argv or argv[0].startswith("-"):
        return argv
    first = argv[0]
    if first in COMMANDS:
        return argv[1:]
    if "/" not in first and not Path(first).exists():
        nearest = difflib.get_close_matches(first, COMMANDS, n=1)
        hint = f" (did you mean {nearest[0]}?)" if nearest else ""
        raise _UsageError(
            f"unknown command {first!r}{hint}; commands: {', '.join(COMMANDS)} "
            "(vllm-minimax-m3-kv check --help; vllm-minimax-m3-kv status), or "
            "--version"
        )
    return argv


def entry() -> None:
    """Console script: ``vllm-minimax-m3-kv [check] ...`` or ``... status``."""
    sys.exit(main())
