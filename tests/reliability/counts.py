"""``python -m tests.reliability.counts``: the matrix's sizes as the code
defines them, for the figures docs/reliability.md states (one JSON line)."""

from __future__ import annotations

import json
import os
from pathlib import Path


def main() -> None:
    os.environ["VLLM_TARGET_DEVICE"] = "cpu"
    from tests.reliability import matrix
    from tests.reliability.matrix import (
        PARTIAL_INSTALL_PLATFORMS,
        PLATFORMS,
        cells,
        partial_install_cells,
        vllm_kv_cache_dtypes,
    )

    sizes = {
        size: sum(len(cells(platform, size)) for platform in PLATFORMS)
        for size in ("quick", "full")
    }
    # The partial-install cells exist once a stock node's stages are given,
    # as the report and the test run give them; counting needs no stages.
    matrix._foreign_stages = Path("stages-not-read")
    print(
        json.dumps(
            {
                "kv_cache_dtypes": len(vllm_kv_cache_dtypes()),
                **sizes,
                "partial_install": sum(
                    len(partial_install_cells(platform))
                    for platform in PARTIAL_INSTALL_PLATFORMS
                ),
            }
        )
    )


if __name__ == "__main__":
    main()
