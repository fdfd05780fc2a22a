"""Regenerate the shipped table of ``vllm serve``'s flags and group help.

``python -m vllm_minimax_m3_kv_sim.programs.regenerate_serve_flags``: reads
them from the parser ``check`` builds, with the installed vLLM, and writes
``vllm_minimax_m3_kv/data/vllm_serve_flags.json``
(``vllm_minimax_m3_kv.entrypoints.serve_flags`` says how they are used).
A maintainer's tool, so it lives here, out of the wheel.
"""

from __future__ import annotations

import json
import os
from importlib import metadata

from vllm_minimax_m3_kv_sim import REPO


def main() -> None:
    # vLLM's serve parser builds on its CPU platform on any machine, as check's.
    from vllm_minimax_m3_kv.entrypoints.serve_flags import (
        DATA_FILE,
        HELP_COLUMNS,
        flags_of_parser,
        group_help_of_parser,
    )

    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    os.environ["COLUMNS"] = str(HELP_COLUMNS)
    from vllm_minimax_m3_kv.entrypoints.check.arguments import (
        build_parser,
        own_flag_names,
    )

    path = REPO / "vllm_minimax_m3_kv" / "data" / DATA_FILE
    own = own_flag_names()
    parser = build_parser()
    flags = [f for f in flags_of_parser(parser) if f not in own]
    group_help = group_help_of_parser(parser)
    data = {"vllm": metadata.version("vllm"), "flags": flags, "group_help": group_help}
    path.write_text(json.dumps(data, indent=0) + "\n")
    print(
        f"{path}: {len(flags)} flags and {len(group_help)} groups' help of vLLM "
        f"{metadata.version('vllm')}"
    )


if __name__ == "__main__":
    main()
