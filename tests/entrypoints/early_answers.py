"""Child for ``test_check_front.py``: check's early answers against vLLM's own.

``python -m tests.entrypoints.early_answers`` prints one JSON object.
"""

from __future__ import annotations

import json
import os

TYPOS = ["fp9", "FP8", "fp8-e4m3", "int8", "bf16", "auto2", "fp4", ""]


def main() -> None:
    os.environ["VLLM_TARGET_DEVICE"] = "cpu"
    os.environ["COLUMNS"] = "100"  # the width the shipped group help is for
    from vllm.config import CacheConfig, ParallelConfig
    from vllm.config.cache import KV_CACHE_DTYPES
    from vllm.engine.arg_utils import EngineArgs

    from vllm_minimax_m3_kv.entrypoints.check.arguments import (
        build_parser,
        own_flag_names,
    )
    from vllm_minimax_m3_kv.entrypoints.check.early import (
        bundled_model_path,
        known_bad_flag,
        vllm_kv_cache_dtypes,
    )
    from vllm_minimax_m3_kv.entrypoints.serve_flags import (
        HELP_COLUMNS,
        flags_of_parser,
        group_help_of_parser,
        known_flags,
        known_group_help,
        mistyped_flag,
    )

    assert int(os.environ["COLUMNS"]) == HELP_COLUMNS

    def vllm_parses(value: str) -> bool:
        """vLLM's own validation of the value (CacheConfig's pydantic type)."""
        try:
            CacheConfig(cache_dtype=value)
        except ValueError:
            return False
        return True

    model = bundled_model_path()
    model_config = EngineArgs(
        model=model, skip_tokenizer_init=True
    ).create_model_config()
    tp_disagreements = []
    sizes = [*range(1, 17), 24, 32, 48, 64, 96, 128]
    for size in sizes:
        try:
            model_config.verify_with_parallel_config(
                ParallelConfig(tensor_parallel_size=size)
            )
            vllm_ok = True
        except ValueError as error:
            vllm_ok = "attention heads" not in str(error)
        early_ok = known_bad_flag(["--tensor-parallel-size", str(size)], model) is None
        if vllm_ok != early_ok:
            tp_disagreements.append(size)
    print(
        json.dumps(
            {
                "kv_dtypes_read_from_source": list(vllm_kv_cache_dtypes() or ()),
                "kv_dtypes_of_vllm": list(KV_CACHE_DTYPES),
                "kv_accepted_by_vllm_rejected_early": [
                    v
                    for v in KV_CACHE_DTYPES
                    if vllm_parses(v) and known_bad_flag(["--kv-cache-dtype", v], None)
                ],
                "kv_typos_accepted_by_either": [
                    v
                    for v in TYPOS
                    if vllm_parses(v)
                    or known_bad_flag(["--kv-cache-dtype", v], None) is None
                ],
                "tp_disagreements": tp_disagreements,
                "tp_checked": len(sizes),
                # The shipped flag list is the installed parser's, less
                # check's own; and no flag vLLM takes is called a typo.
                "serve_flags_of_vllm": [
                    f
                    for f in flags_of_parser(build_parser())
                    if f not in own_flag_names()
                ],
                "own_flags": sorted(own_flag_names()),
                "serve_flags_shipped": known_flags(),
                # --help=GROUP from the shipped table is vLLM's own text.
                "groups_with_help": len(group_help_of_parser(build_parser())),
                "group_help_differs": [
                    group
                    for group, text in group_help_of_parser(build_parser()).items()
                    if known_group_help(group) != text
                ],
                "valid_flags_called_typos": [
                    f for f in flags_of_parser(build_parser()) if mistyped_flag([f], [])
                ],
            }
        )
    )


if __name__ == "__main__":
    main()
