"""Everything ``check`` answers before vLLM is imported, in well under a
second: ``--version``, ``--help``, its own flags, a model it cannot read, a
missing or unsupported vLLM, a mistyped flag, and flag values vLLM is known to
refuse (read from vLLM's source, not imported)."""

from __future__ import annotations

import ast
import contextlib
import difflib
import json
import os
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from vllm_minimax_m3_kv._versions import (
    DISTRIBUTION,
    SUPPORTED_VLLM_INSTALL,
    installed_version,
    vllm_source_file,
    vllm_version_problem,
)
from vllm_minimax_m3_kv.config.pool_facts import FP8_E4M3
from vllm_minimax_m3_kv.config.targets import HERE, TARGETS
from vllm_minimax_m3_kv.entrypoints.check.arguments import (
    CheckUsageError,
    own_parser,
)
from vllm_minimax_m3_kv.entrypoints.serve_flags import mistyped_flag
from vllm_minimax_m3_kv.entrypoints.status import identity, vllm_loads_this_plugin
from vllm_minimax_m3_kv.envs import switch_problem

BUNDLED_HUB_ID = "MiniMaxAI/MiniMax-M3"
"""The checkpoint whose architecture values the bundled config carries."""


def bundled_model_path() -> str:
    """A MiniMax-M3 config with the checkpoint's architecture values, no weights."""
    return str(resources.files("vllm_minimax_m3_kv") / "data" / "minimax_m3")


@dataclass(frozen=True)
class EarlyAnswer:
    target: str | None
    help: bool | str
    model: str | None
    version: bool = False
    commands: str | None = None
    bundled_for: str | None = None
    """A hub id not in the local cache whose bundled config is judged."""
    as_json: bool = False
    quiet: bool = False


def versions_line() -> str:
    """Both versions, from package metadata (vLLM is not imported)."""
    vllm = installed_version("vllm") or "not installed"
    return f"{DISTRIBUTION} {identity()}; vLLM {vllm}"


def plugin_excluded() -> bool:
    """Whether ``VLLM_PLUGINS`` leaves this plugin out (``status`` says why)."""
    return not vllm_loads_this_plugin()


def judges_this_machine(argv: list[str]) -> bool:
    """``--target here`` in any case, as check's parser reads it (``str.lower``)."""
    target = flag_value(argv, "--target")
    return target is not None and target.lower() == HERE


def flag_value(rest: list[str], *names: str) -> str | None:
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
    return None if named is None else (*named, FP8_E4M3)


def _literal_of_vllm(module: str, name: str) -> tuple[str, ...] | None:
    """A ``Name = Literal[...]`` of ``vllm/config/<module>``, read, not imported."""
    source = vllm_source_file(f"vllm.config.{module.removesuffix('.py')}")
    if source is None:
        return None
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
    kv = flag_value(rest, "--kv-cache-dtype")
    choices = vllm_kv_cache_dtypes()
    if kv is not None and choices and kv not in choices:
        nearest = difflib.get_close_matches(kv, choices, n=1, cutoff=0.5)
        hint = f"did you mean {nearest[0]}? " if nearest else ""
        return (
            f"--kv-cache-dtype {kv!r} is not one vLLM takes; {hint}valid: "
            f"{', '.join(choices)}"
        )
    indexer = flag_value(rest, "--attention-config.indexer_kv_dtype")
    attention_json = flag_value(rest, "--attention-config", "-ac")
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
    tp = flag_value(rest, "--tensor-parallel-size", "-tp")
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


def model_argument(rest: list[str]) -> str | None:
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


def without_model(argv: list[str], model: str) -> list[str]:
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


def judge_without_vllm(argv: list[str]) -> EarlyAnswer:
    """Everything check can answer before importing vLLM, or CheckUsageError."""
    own, rest = own_parser().parse_known_args(argv)
    if own.version:
        return EarlyAnswer(None, False, None, version=True)
    if own.help is not False:
        if own.help is not True and (problem := vllm_version_problem()) is not None:
            # --help=GROUP is vLLM's own help: it needs vLLM.
            raise CheckUsageError(
                f"--help={own.help}: {problem}. {SUPPORTED_VLLM_INSTALL}"
            )
        return EarlyAnswer(None, own.help, None)
    target = getattr(own, "target", None)
    if target is None:
        raise CheckUsageError(
            f"the following argument is required: --target (one of: "
            f"{', '.join(TARGETS)}; or {HERE}, this machine)"
        )
    if (problem := switch_problem()) is not None:
        # vLLM evaluates the plugin's variables at start, for every model.
        raise CheckUsageError(f"vllm serve stops at start: {problem}")
    if own.commands is not None:
        if not Path(own.commands).is_file():
            raise CheckUsageError(f"--commands {own.commands}: no such file")
        return EarlyAnswer(
            target,
            False,
            None,
            commands=own.commands,
            as_json=own.json,
            quiet=own.quiet,
        )
    model = model_argument(rest)
    bundled_for = None
    if (
        model is not None
        and not Path(model).is_dir()
        and _offline()
        and not _in_local_hub_cache(model)
    ):
        if model != BUNDLED_HUB_ID:
            raise CheckUsageError(unreadable_model_message(model))
        # As the launch scripts do: the bundled config is that checkpoint's.
        bundled_for, model = model, None
    if (problem := vllm_version_problem()) is not None:
        raise CheckUsageError(f"{problem}. {SUPPORTED_VLLM_INSTALL}")
    own_flags = [
        option for action in own_parser()._actions for option in action.option_strings
    ]
    if (typo := mistyped_flag(rest, own_flags)) is not None:
        raise CheckUsageError(f"vLLM takes no flag {typo}")
    if (bad := known_bad_flag(rest, model)) is not None:
        raise CheckUsageError(f"vLLM refuses these flags: {bad}")
    return EarlyAnswer(
        target,
        False,
        model,
        bundled_for=bundled_for,
        as_json=own.json,
        quiet=own.quiet,
    )
