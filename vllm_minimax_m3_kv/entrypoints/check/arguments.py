"""check's command line: its own flags, read before vLLM is imported, and
vLLM's ``vllm serve`` parser with those flags added, built only when a
verdict needs it. Also the exit codes, which are this command's contract."""

from __future__ import annotations

import argparse
import difflib
from typing import ClassVar

from vllm_minimax_m3_kv._versions import DISTRIBUTION, PLUGIN_ENTRY_POINT
from vllm_minimax_m3_kv.config.targets import HERE, TARGETS
from vllm_minimax_m3_kv.envs import ALLOW_MIXED_ENV

PROG = f"{DISTRIBUTION} check"
EXIT_OK, EXIT_USAGE, EXIT_REFUSED, EXIT_MIXED = 0, 1, 2, 3
EXIT_UNJUDGED = 4
"""``--commands``: some line could not be judged; every judged one starts uniform."""


class CheckUsageError(Exception):
    """This command's usage error (exit 1): one line, no traceback."""


COMMON_GROUPS = (
    "ModelConfig",
    "CacheConfig",
    "ParallelConfig",
    "SchedulerConfig",
    "AttentionConfig",
    "VllmConfig",
)


USAGE = (
    f"{PROG} [MODEL] --target TARGET [--json | --quiet] [--verbose] [vllm serve flags]"
)


DESCRIPTION = (
    "Preflight a MiniMax-M3 `vllm serve` command for KV precision, on any "
    "machine: no GPU, no weights, no network."
)


EPILOG = f"""\
MODEL is a local checkpoint directory or a Hugging Face id already in the
local cache (check never downloads); omitted, the bundled MiniMax-M3 config is
judged. Every other flag is a `vllm serve` flag, parsed by vLLM's own parser:
--help=GROUP lists a group's flags (from a table shipped for the installed
vLLM, no import), --help=WORD the flags whose name holds WORD, --help=all every
flag (these two import vLLM). Common groups:
{", ".join(COMMON_GROUPS)}. The indexer's dtype is a field of
--attention-config (in VllmConfig): --help=attention-config shows it, and
--attention-config.indexer_kv_dtype fp8 sets it.

With VLLM_PLUGINS set and {PLUGIN_ENTRY_POINT} not in it, the plan is stock vLLM
0.33's, as `vllm serve` would run it.

exit codes: 0 starts with one precision; 3 starts with a mixed pool: one you
opted into (VLLM_MINIMAX_M3_KV_ALLOW_MIXED=1), or stock vLLM's (VLLM_PLUGINS
leaves the plugin out; the plan's first row says so); 2 refused at startup (the
reason and its fixes on stderr); 1 usage error. --json also carries the fixes,
one object each, and both versions; --quiet prints no plan (the exit code is
the verdict).
"""


VERBOSE_FLAG = "--verbose"


JSON_FLAG = "--json"


QUIET_FLAG = "--quiet"


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


def add_check_arguments(parser: argparse.ArgumentParser) -> list[argparse.Action]:
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
        (output := group.add_mutually_exclusive_group()).add_argument(
            JSON_FLAG, action="store_true", help="Print the plan as one JSON object."
        ),
        # No -q: vLLM's serve parser takes it for --quantization.
        output.add_argument(
            QUIET_FLAG,
            action="store_true",
            help="Print no plan; the exit code is the verdict (refusals, their "
            "fixes and warnings still go to stderr).",
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
        raise CheckUsageError(message)


def own_flag_names() -> frozenset[str]:
    """The long flags check adds to vLLM's serve parser, read from the parser
    that adds them (so the shipped list of vLLM's flags never holds them)."""
    scratch = argparse.ArgumentParser(add_help=False)
    return frozenset(
        option
        for action in add_check_arguments(scratch)
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
    add_check_arguments(parser)
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


def build_parser() -> argparse.ArgumentParser:
    """The full parser: vLLM's ``vllm serve`` parser with check's flags first."""
    from vllm.entrypoints.common.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    class CheckParser(FlexibleArgumentParser):
        check_actions: ClassVar[list[argparse.Action]] = []

        def error(self, message: str) -> None:  # type: ignore[override]
            raise CheckUsageError(message)

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
    CheckParser.check_actions = add_check_arguments(parser)
    return parser


def vllm_help(parser: argparse.ArgumentParser, keyword: str) -> str:
    """vLLM's own ``--help=KEYWORD`` text, or CheckUsageError when nothing in
    ``vllm serve`` matches it (vLLM itself prints a note and exits 0)."""
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    FlexibleArgumentParser._search_keyword = keyword.lower()
    try:
        text = parser.format_help()
    finally:
        FlexibleArgumentParser._search_keyword = None
    if "No group or arguments matching" in text:
        raise CheckUsageError(
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
