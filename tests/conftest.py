"""Shared fixtures: run scenarios through real vLLM on a simulated platform.

Each platform needs its own process (vLLM resolves its platform once per
process), so scenarios are batched per (platform, extra environment) and run
in one child process; results are cached for the whole session.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest

from vllm_minimax_m3_kv_sim import REPO
from vllm_minimax_m3_kv_sim.plumbing.children import (
    SHARED_ADDRESS_ENV,
    child_env,
    json_from_out_file,
    server_address,
)

__all__ = ["REPO", "child_env", "run_scenarios"]

_cache: dict[str, dict[str, dict[str, Any]]] = {}


def run_scenarios(
    platform: str,
    scenarios: list[dict[str, Any]],
    env: dict[str, str] | None = None,
    timeout: float = 900,
) -> dict[str, dict[str, Any]]:
    """Results by scenario id, from one child process on ``platform``."""
    key = json.dumps([platform, scenarios, env], sort_keys=True)
    if key in _cache:
        return _cache[key]
    with tempfile.TemporaryDirectory() as tmp:
        scenario_file = Path(tmp, "scenarios.json")
        scenario_file.write_text(json.dumps(scenarios))
        argv = ["-m", "vllm_minimax_m3_kv_sim.programs.runner", "--platform", platform]
        records = json_from_out_file(
            [*argv, "--scenarios", str(scenario_file)], env, timeout
        )
    _cache[key] = {r["id"]: r for r in records}
    return _cache[key]


# -- tiers: every marker is applied here, by where a test lives ---------------

FAST: dict[str, frozenset[str] | None] = {
    # Pure policy and docs: no vLLM import, in this process or a child.
    "tests/config/test_indexer_precision.py": None,
    "tests/config/test_kv_cache_dtype.py": None,
    "tests/config/test_recorded_verdict.py": None,
    "tests/test_package_shape.py": None,
    "tests/test_envs.py": None,
    "tests/scripts/test_paired_rule.py": None,
    "tests/scripts/test_long_context_evals.py": None,
    "tests/entrypoints/test_check_commands.py": frozenset(
        {
            "test_continuations_join_and_comments_and_blanks_are_skipped",
            "test_the_public_recipe_is_one_command",
            "test_the_exit_code_is_the_worst_verdict",
            "test_a_script_is_read_as_bash_runs_it",
            "test_skipped_lines_count_for_nothing_and_unjudged_serve_lines_do",
        }
    ),
    "tests/entrypoints/test_output.py": frozenset(
        {
            "test_status_json_is_one_object_with_every_row_and_the_exit",
            "test_status_text_and_json_carry_the_same_rows",
            "test_status_quiet_prints_nothing_and_answers_by_exit_code",
            "test_a_problem_reaches_stderr_in_every_mode",
        }
    ),
    "tests/test_docs.py": frozenset(
        {
            "test_every_fix_line_pastes_into_bash",
            "test_a_refusal_says_what_where_and_why_in_one_short_first_line",
            "test_readme_is_one_page",
            "test_every_quoted_message_is_one_the_code_prints",
            "test_quotes_from_vllm_are_in_vllm",
            "test_the_old_invented_message_would_be_caught",
            "test_startup_cost_table_was_measured_on_the_current_load_path",
            "test_every_no_zeroer_claim_names_the_kernels_it_was_shown_on",
        }
    ),
}
"""``-m fast``: modules (None: every test) or the tests of a module."""
UPSTREAM = "tests/upstream/"
"""``-m upstream``: the patch series against vLLM's source, its pre-commit."""
TIER_PROBE_ENV = "MINIMAX_M3_KV_TIER_PROBE"
"""A file to write, at the end of a run, whether it imported vLLM or torch."""


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        path = item.nodeid.split("::", 1)[0]
        name = getattr(item, "originalname", item.name)
        if path.startswith(UPSTREAM):
            item.add_marker(pytest.mark.upstream)
        if path in FAST and (FAST[path] is None or name in FAST[path]):
            item.add_marker(pytest.mark.fast)


def pytest_sessionfinish(session: pytest.Session) -> None:
    if probe := os.environ.get(TIER_PROBE_ENV):
        imported = {name: name in sys.modules for name in ("vllm", "torch")}
        Path(probe).write_text(json.dumps(imported))


def pytest_configure(config: pytest.Config) -> None:
    """Under xdist, the controller starts the fork server its workers share
    (its preload is paid once, and only when a child is asked for); without
    xdist the suite runs serially, and its scheduler hook stays out."""
    workers = getattr(config.option, "numprocesses", None)
    if workers and not hasattr(config, "workerinput"):
        os.environ[SHARED_ADDRESS_ENV] = server_address()
    if config.pluginmanager.hasplugin("xdist"):
        config.pluginmanager.register(_KernelsOnOneWorker(), "kernels_on_one_worker")


class _KernelsOnOneWorker:
    @staticmethod
    def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
        """xdist's loadscope, with ``tests/kernels/`` one scope: its modules'
        children run under Triton's interpreter, which needs a fork server of
        its own (``vllm_minimax_m3_kv_sim.plumbing.children.FROZEN_AT_PRELOAD``), so one worker starts one."""
        if config.getoption("dist") != "loadscope":
            return None
        from xdist.scheduler import LoadScopeScheduling

        class KernelsTogether(LoadScopeScheduling):
            def _split_scope(self, nodeid: str) -> str:
                if nodeid.startswith("tests/kernels/"):
                    return "tests/kernels"
                return super()._split_scope(nodeid)

        return KernelsTogether(config, log)


@pytest.fixture(scope="session")
def scenario_runner():
    return run_scenarios


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--matrix",
        choices=("quick", "full"),
        default="quick",
        help="size of the reliability matrix and of the upstream equivalence "
        "run (tests/reliability/matrix.py SIZES); CI also runs full",
    )


@pytest.fixture(scope="session")
def matrix_size(request: pytest.FixtureRequest) -> str:
    return request.config.getoption("--matrix")


@pytest.fixture(scope="session")
def reliability_matrix(
    tmp_path_factory, worker_id, matrix_size
) -> dict[str, dict[str, list]]:
    """The whole reliability matrix (``tests/reliability/report.py``), run once
    per test run: judged in ``tests/reliability/``, and the plugin's side of
    the upstream patch's equivalence test in ``tests/upstream/``. Under xdist
    the first worker to ask runs it and the other reads its result."""
    from filelock import FileLock

    from tests.reliability.report import run_matrix

    if worker_id == "master":
        return run_matrix(matrix_size)
    shared = tmp_path_factory.getbasetemp().parent / "reliability_matrix.json"
    with FileLock(f"{shared}.lock"):
        if not shared.is_file():
            shared.write_text(json.dumps(run_matrix(matrix_size)))
        return json.loads(shared.read_text())
