"""``python -m vllm_minimax_m3_kv_sim.plumbing.forked ARGV...``: ``python ARGV`` in a child of the fork
server at ``$SIM_FORK_SERVER``, with this process's environment; relays its
output and exit code. For Python commands that a shell script under test runs
(the launch scripts' ``CHECK_BIN``), so each skips the preloaded imports.
"""

from __future__ import annotations

import os
import sys

from vllm_minimax_m3_kv_sim.plumbing.children import run_python


def main() -> int:
    proc = run_python(sys.argv[1:], dict(os.environ), cwd=os.getcwd(), exact_env=True)
    sys.stdout.write(proc.stdout)
    sys.stderr.write(proc.stderr)
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main())
