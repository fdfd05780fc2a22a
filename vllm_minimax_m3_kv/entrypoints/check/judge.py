"""The in-process judgement: vLLM's own config validation for the
command, as ``vllm serve`` runs it, with the plugin's hook judging for the
target; vLLM's refusals become this command's usage errors in vLLM's words."""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import logging
import os
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

from vllm_minimax_m3_kv import register
from vllm_minimax_m3_kv.config.facts import is_minimax_m3
from vllm_minimax_m3_kv.config.pool_facts import PrecisionFacts
from vllm_minimax_m3_kv.config.targets import HERE, TARGETS, judging_for
from vllm_minimax_m3_kv.config.verdicts import Verdict
from vllm_minimax_m3_kv.entrypoints.check.arguments import CheckUsageError
from vllm_minimax_m3_kv.entrypoints.check.early import (
    bundled_model_path,
    plugin_excluded,
    unreadable_model_message,
)
from vllm_minimax_m3_kv.entrypoints.check.plan import Plan
from vllm_minimax_m3_kv.entrypoints.check.pool import plugin_plan, stock_plan
from vllm_minimax_m3_kv.entrypoints.output import Output


def engine_args_for(args: argparse.Namespace) -> tuple[Any, str]:
    """``vllm serve``'s EngineArgs for parsed arguments (the bundled config
    where no model is named), and the flags set aside for it, with why."""
    from vllm.engine.arg_utils import EngineArgs

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
    # EngineArgs resolves a hub id to a local snapshot on construction.
    return EngineArgs.from_cli_args(args), not_judged


def plan_for(args: argparse.Namespace, argv: list[str] | None = None) -> Plan:
    """Judge parsed ``vllm serve`` arguments for ``args.target``; ``argv``,
    what they were parsed from, lets stock vLLM's own build answer where
    ``VLLM_PLUGINS`` leaves the plugin out."""
    from vllm_minimax_m3_kv.entrypoints.check import stock_build

    # Stock's build runs in a child while this process judges.
    stock_child = (
        stock_build.start(argv, args.target)
        if argv is not None and plugin_excluded()
        else None
    )
    try:
        return _plan(args, stock_child)
    finally:
        if stock_child is not None and stock_child.poll() is None:
            stock_child.kill()  # this command was refused before its answer
            stock_child.wait()


def _plan(args: argparse.Namespace, stock_child: Any) -> Plan:
    from vllm_minimax_m3_kv.entrypoints.check import stock_build

    try:
        engine_args, not_judged = engine_args_for(args)
        model_config = engine_args.create_model_config()
    except Exception as error:  # unreadable model: this command's usage error
        raise CheckUsageError(unreadable_model(args.model, error)) from error
    if not is_minimax_m3(model_config):
        raise CheckUsageError(
            f"{model_config.architecture} is not a MiniMax-M3 architecture; "
            "this check only judges MiniMax-M3."
        )
    executor_note = without_ray_if_absent(engine_args)
    # The facts come from the plugin's hook inside vLLM's own validation,
    # whatever VLLM_PLUGINS says (a refused stock command's fix turns the
    # plugin on); with the plugin left out, stock's own build answers.
    register()
    facts, verdict = judge_like_vllm_serve(
        engine_args, args.target, quiet=not args.verbose
    )
    if stock_child is not None:
        stock = stock_build.answer(stock_child)
        return replace(
            stock_plan(model_config, facts, verdict, stock, args.target, executor_note),
            not_judged=not_judged,
        )
    return replace(
        plugin_plan(model_config, facts, verdict, args.target, executor_note),
        not_judged=not_judged,
    )


@contextlib.contextmanager
def quiet_stderr(quiet: bool) -> Iterator[None]:
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
        except CheckUsageError:  # says everything in one line of its own
            failed = False
            raise
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            if failed:
                sink.seek(0)
                # The hidden logs, as they were: they say why it broke.
                Output().problem(sink.read()[-8000:].decode(errors="replace"))


def require_a_gpu_here() -> None:
    from vllm.platforms import current_platform

    if not (current_platform.is_rocm() or current_platform.is_cuda()):
        raise CheckUsageError(
            f"--target {HERE}: vLLM finds no CUDA or ROCm GPU on this machine; "
            f"run it on the serving node, or name the GPU to judge for, e.g. "
            f"--target mi355x ({', '.join(TARGETS)})"
        )


def without_ray_if_absent(engine_args: Any) -> str:
    """The KV pool does not depend on the executor backend, so a Ray layout
    is judged on a machine without Ray; the plan says so."""
    if engine_args.distributed_executor_backend != "ray":
        return ""
    if importlib.util.find_spec("ray") is not None:
        return "ray"
    engine_args.distributed_executor_backend = "mp"
    return "ray (not installed here, not imported: the KV pool does not depend on it)"


def judge_like_vllm_serve(
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
                    raise CheckUsageError(
                        f"vLLM refuses these flags: {validation_words(error)}"
                    ) from error
    finally:
        logging.disable(logging.NOTSET)
    if judgement.facts is None or judgement.verdict is None:
        raise CheckUsageError(
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
    from vllm_minimax_m3_kv.patch_sites import (
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


def validation_words(error: BaseException) -> str:
    """vLLM's refusal in one line: the validator's message, or for a field
    constraint pydantic's own field and words (not "1 validation error")."""
    cause = validation_cause(error)
    if cause is not error:
        return first_line(cause)
    errors = getattr(error, "errors", None)
    if callable(errors):
        with contextlib.suppress(Exception):
            first = errors()[0]
            where = ".".join(str(part) for part in first.get("loc", ()))
            title = getattr(error, "title", "")
            field = f"{title}.{where}" if title and where else where or title
            return f"{field}: {first['msg']}" if field else str(first["msg"])
    return first_line(error)


def first_line(error: BaseException) -> str:
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


def unreadable_model(model: str, error: Exception) -> str:
    if Path(model).is_dir():  # read, and refused by vLLM's own validation
        return f"vLLM refuses these flags: {first_line(validation_cause(error))}"
    return unreadable_model_message(model)
