"""``vllm-minimax-m3-kv check``: will this MiniMax-M3 config start uniform?

Takes the flags ``vllm serve`` takes (parsed by vLLM's own parser) plus
``--target``, and answers on a machine without that GPU: the same facts and
the same :func:`decide` the live config hook uses, with the target's hardware
facts in place of the detected platform. Exit 0: starts uniform. Exit 2: the
validator's error (cause and fix). Exit 1: this command's own usage errors.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import asdict, dataclass, replace
from importlib import resources
from pathlib import Path
from typing import Any, ClassVar

from vllm_minimax_m3_kv import register
from vllm_minimax_m3_kv.config.facts import (
    TARGETS,
    is_minimax_m3,
    judging_for,
    target_platform_facts,
)
from vllm_minimax_m3_kv.config.indexer_precision import (
    ALLOW_MIXED_ENV,
    STOCK_INDEXER_DEFAULT,
    Outcome,
    PrecisionFacts,
    Verdict,
)

EXIT_OK, EXIT_USAGE, EXIT_REFUSED, EXIT_MIXED = 0, 1, 2, 3

ZEROER_NOT_BUILT = "not built"
ZEROER_HONOURED = (
    f"built and honoured on every worker and the scheduler ({ALLOW_MIXED_ENV}=1)"
)
ZEROER_REFUSED = "none: this configuration is refused at startup"


def bundled_model_path() -> str:
    """A MiniMax-M3 config with the checkpoint's architecture values, no weights."""
    return str(resources.files("vllm_minimax_m3_kv") / "data" / "minimax_m3")


class _UsageError(Exception):
    pass


VERBOSE_FLAG = "--verbose"
_CHECK_SECTION = "check options (then every `vllm serve` flag; --help=GROUP for one)"


def build_parser() -> argparse.ArgumentParser:
    from vllm.entrypoints.common.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    class CheckParser(FlexibleArgumentParser):
        check_actions: ClassVar[list[argparse.Action]] = []

        # argparse exits 2 on bad flags; 2 means "refused" here.
        def error(self, message: str) -> None:  # type: ignore[override]
            raise _UsageError(message)

        def format_help(self) -> str:
            # vLLM's help lists config groups only; this command's own flags
            # go first, in full, so nobody needs --help=options to find them.
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
        CheckParser(
            prog="vllm-minimax-m3-kv check",
            description="Preflight a MiniMax-M3 `vllm serve` command for KV "
            "precision, on any machine: no GPU, no weights, no network.",
            usage="vllm-minimax-m3-kv check [model_tag] --target TARGET "
            "[--json] [--verbose] [vllm serve flags]",
        )
    )
    CheckParser.check_actions = [
        parser.add_argument(
            "--target",
            required=True,
            choices=TARGETS,
            help="GPU to judge for. VLLM_ROCM_* and VLLM_MINIMAX_M3_KV_ALLOW_MIXED "
            "are read from the environment.",
        ),
        parser.add_argument(
            "--json", action="store_true", help="Print one JSON object."
        ),
        parser.add_argument(
            VERBOSE_FLAG,
            action="store_true",
            help="Show vLLM's own import and config logs (hidden by default).",
        ),
    ]
    return parser


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

    def render(self) -> str:
        rows = [
            ("architecture", self.architecture),
            ("target", self.target),
            ("main KV dtype", self.kv_cache_dtype),
            (
                "indexer dtype",
                self.indexer_kv_dtype
                + (" (inherited from the KV cache)" if self.indexer_inherited else ""),
            ),
            ("uniform precision", "yes" if self.uniform_precision else "no"),
            ("KV block zeroer", self.kv_block_zeroer),
            (
                f"bytes/token @TP{self.tensor_parallel_size}",
                f"main {self.bytes_per_token_main:,} + indexer "
                f"{self.bytes_per_token_indexer:,} = {self.bytes_per_token_total:,}",
            ),
            (
                "token capacity vs stock",
                f"{self.token_capacity_vs_stock:.2f}x "
                f"(stock vLLM 0.33: {self.stock_bytes_per_token_total:,} bytes/token)",
            ),
        ]
        width = max(len(name) for name, _ in rows)
        lines = [f"{name:<{width}}  {value}" for name, value in rows]
        if self.outcome in (Outcome.ERROR.value, Outcome.MIXED.value):
            lines += ["", self.message]
        return "\n".join(lines)

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
    if args.model == EngineArgs.model:  # no model given: the bundled config
        args.model = bundled_model_path()
        args.skip_tokenizer_init = True
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
    # Judged by the plugin's own hook, whatever VLLM_PLUGINS says.
    register()
    facts, verdict = _judge_like_vllm_serve(
        engine_args, args.target, quiet=not args.verbose
    )
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
    # Both caches bf16 (unchanged) is uniform too; only MIXED and ERROR are not.
    uniform = verdict.outcome not in (Outcome.MIXED, Outcome.ERROR)
    zeroer = {
        Outcome.ERROR: ZEROER_REFUSED,
        Outcome.MIXED: ZEROER_HONOURED,
    }.get(verdict.outcome, ZEROER_NOT_BUILT)
    platform = target_platform_facts(args.target)
    return Plan(
        architecture=model_config.architecture,
        target=f"{args.target} ({platform.name})",
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
                        f"vLLM refuses these flags: {_first_line(cause)}"
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
    """On a vLLM that carries the upstream fix (``upstream/``), its own
    MiniMax-M3 decision would judge this CPU rather than the target. For this
    one offline validation the plugin's hook runs in its place, judging for the
    target under ``judging_for`` as it does on stock vLLM, and the rest of
    vLLM's validation runs as usual. Restored on exit; never used when serving."""
    from vllm_minimax_m3_kv.patches import (
        NATIVE_DECISION_MODULE,
        native_decision_in_vllm,
    )

    if native_decision_in_vllm() is None:
        yield
        return
    import importlib

    from vllm_minimax_m3_kv.model_executor.models.config import (
        apply_indexer_precision,
    )

    module = importlib.import_module(NATIVE_DECISION_MODULE)
    native = module.verify_and_update_index_cache_dtype
    module.verify_and_update_index_cache_dtype = apply_indexer_precision
    try:
        yield
    finally:
        module.verify_and_update_index_cache_dtype = native


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
    return (
        f"cannot read the model config for {model!r}: it is not a local "
        "directory, and check does not download (HF_HUB_OFFLINE=1 unless you "
        "set it). Pass a local checkpoint directory, or omit the model to judge "
        "the bundled MiniMax-M3 config."
    )


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    # The verdict is for --target, never for this machine: vLLM's CPU platform
    # lets its serve parser build anywhere, GPU or not, and the same way.
    os.environ["VLLM_TARGET_DEVICE"] = "cpu"
    # A preflight reads configs it has; a hub id it lacks fails at once
    # rather than retrying for minutes on a machine without network.
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    # stdout is the plan (or its JSON); vLLM's own logs, shown with
    # --verbose, go to stderr.
    os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")
    if argv[:1] == ["check"]:
        argv = argv[1:]
    try:
        with _quiet_stderr(VERBOSE_FLAG not in argv):
            args = build_parser().parse_args(argv)
            plan = plan_for(args)
    except _UsageError as error:
        print(f"vllm-minimax-m3-kv check: {error}", file=sys.stderr)
        return EXIT_USAGE
    if args.json:
        print(json.dumps(asdict(plan), indent=2))
    else:
        print(plan.render())
    for note in plan.notes:
        print(f"warning: {note}", file=sys.stderr)
    return plan.exit_code


def entry() -> None:
    """Console script: ``vllm-minimax-m3-kv [check] ...``."""
    sys.exit(main())
