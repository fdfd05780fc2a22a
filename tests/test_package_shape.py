"""The package's shape: no import cycles, lazy imports included, ``check``
split into modules small enough to read whole, no product module over about
500 lines, and the simulation harness in layers and out of the wheel."""

from __future__ import annotations

import ast
import re
import tomllib
from pathlib import Path

import setuptools

from vllm_minimax_m3_kv_sim import REPO

PACKAGE = "vllm_minimax_m3_kv"
HARNESS = "vllm_minimax_m3_kv_sim"
CHECK_MODULE_MAX_LINES = 400
PRODUCT_MODULE_MAX_LINES = 520


def _modules(package: str = PACKAGE) -> dict[str, Path]:
    modules = {}
    for path in (REPO / package).rglob("*.py"):
        parts = list(path.relative_to(REPO).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        modules[".".join(parts)] = path
    return modules


def _imported(module: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The package's modules ``module`` imports anywhere in its source, at
    module level or inside a function (``from p import m`` names module ``m``
    when it is one, else ``p``)."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parts, base] if base else parts)
            for alias in node.names:
                named = f"{base}.{alias.name}"
                found.add(named if named in modules else base)
    return {name for name in found if name in modules and name != module}


def import_graph(package: str = PACKAGE) -> dict[str, set[str]]:
    modules = _modules(package)
    return {name: _imported(name, path, modules) for name, path in modules.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for target in sorted(graph[node]):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_import_cycles_lazy_imports_included():
    # A package's __init__ runs before its submodules by Python's rules; the
    # edges here are the imports each module itself writes.
    graph = import_graph()
    assert f"{PACKAGE}.entrypoints.check.run" in graph
    assert cycles(graph) == []


def test_the_cycle_finder_finds_a_lazy_cycle():
    graph = import_graph()
    # The cycle this package had: serve_flags' generator imported check's
    # parser lazily while check imported serve_flags.
    graph[f"{PACKAGE}.entrypoints.check.arguments"].add(
        f"{PACKAGE}.entrypoints.serve_flags"
    )
    graph[f"{PACKAGE}.entrypoints.serve_flags"].add(
        f"{PACKAGE}.entrypoints.check.arguments"
    )
    assert cycles(graph)


def test_check_is_split_into_modules_small_enough_to_read_whole():
    folder = REPO / PACKAGE / "entrypoints" / "check"
    sizes = {
        path.name: len(path.read_text(encoding="utf-8").splitlines())
        for path in folder.glob("*.py")
    }
    assert {
        "arguments.py",
        "early.py",
        "judge.py",
        "plan.py",
        "pool.py",
        "run.py",
    } <= set(sizes)
    assert max(sizes.values()) <= CHECK_MODULE_MAX_LINES, sizes
    # Importing one part never imports the others.
    init = ast.parse((folder / "__init__.py").read_text(encoding="utf-8"))
    assert not [n for n in init.body if isinstance(n, (ast.Import, ast.ImportFrom))]


def test_batch_and_the_simulation_harness_judge_through_run_check():
    # A result object, not a verdict parsed back out of what main() printed.
    for path in (
        REPO / PACKAGE / "entrypoints" / "check" / "batch.py",
        REPO / HARNESS / "programs" / "check_batch.py",
    ):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        imported = {
            alias.name
            for node in ast.walk(tree)
            if isinstance(node, ast.ImportFrom)
            and (node.module or "").startswith(f"{PACKAGE}.entrypoints")
            for alias in node.names
        }
        assert "run_check" in imported and "main" not in imported, path
        assert "redirect_stdout" not in ast.unparse(tree), path


def test_no_product_module_is_too_long_to_read_whole():
    sizes = {
        name: len(path.read_text(encoding="utf-8").splitlines())
        for name, path in _modules().items()
    }
    too_long = {name: n for name, n in sizes.items() if n > PRODUCT_MODULE_MAX_LINES}
    assert not too_long


def test_the_harness_keeps_library_plumbing_and_programs_apart():
    # Programs run in child processes and may use anything; plumbing starts
    # them and never imports a program; the library imports neither.
    graph = import_graph(HARNESS)
    layer = {
        name: name.removeprefix(f"{HARNESS}.").partition(".")[0]
        if name.count(".") > 1
        else "library"
        for name in graph
    }
    assert {"library", "plumbing", "programs"} <= set(layer.values()), layer
    allowed = {
        "library": {"library"},
        "plumbing": {"library", "plumbing"},
        "programs": {"library", "plumbing", "programs"},
    }
    crossing = [
        (name, target)
        for name, targets in graph.items()
        for target in targets
        if layer[target] not in allowed[layer[name]]
    ]
    assert not crossing
    assert not cycles(graph)


def test_only_the_plugin_is_installed():
    found = pyproject_packages()
    assert PACKAGE in found and f"{PACKAGE}.config" in found
    assert not [
        name for name in found if not name.startswith(f"{PACKAGE}.") and name != PACKAGE
    ], found


def pyproject_packages() -> list[str]:
    """What setuptools packages from pyproject's ``packages.find``."""
    config = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
    find = config["tool"]["setuptools"]["packages"]["find"]
    return setuptools.find_packages(where=str(REPO), include=find["include"])


def test_the_plugins_names_are_declared_once_and_copied_where_they_must_be():
    from vllm_minimax_m3_kv._versions import (
        DISTRIBUTION,
        ENTRY_POINT_GROUP,
        PLUGIN_ENTRY_POINT,
    )

    project = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
    assert project["project"]["name"] == DISTRIBUTION
    assert DISTRIBUTION in project["project"]["scripts"]
    plugins = project["project"]["entry-points"][ENTRY_POINT_GROUP]
    assert plugins == {PLUGIN_ENTRY_POINT: f"{PACKAGE}:register"}
    # Bash cannot import them: the launch scripts' default CLI is pinned here,
    # and they find the entry point by its package.
    bench = (REPO / "scripts" / "lib" / "minimaxm3_fp8_bench.sh").read_text()
    assert f"DEFAULT_CHECK_BIN={DISTRIBUTION}\n" in bench
    assert not re.search(rf"(?<!\w){PLUGIN_ENTRY_POINT}\b", bench)


def test_nothing_outside_entrypoints_imports_from_it():
    # The live hook renders its refusal through verdict_text, not the CLI;
    # only ``python -m``'s __main__ starts the CLI.
    entrypoints = f"{PACKAGE}.entrypoints"
    inward = [
        (name, target)
        for name, targets in import_graph().items()
        if not name.startswith(entrypoints) and name != f"{PACKAGE}.__main__"
        for target in targets
        if target.startswith(entrypoints)
    ]
    assert not inward


def test_the_policy_builds_refusals_as_values_not_text():
    # No module of config/ splits a message back into lines, and reading a
    # rendered fix back is the reliability matrix's own (tests/reliability).
    from vllm_minimax_m3_kv.config.verdicts import Fix

    splitting = [
        (path.name, node.lineno)
        for path in (REPO / PACKAGE / "config").glob("*.py")
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and (
            node.func.attr == "splitlines"
            or (
                node.func.attr in ("split", "partition", "rsplit")
                and any(
                    isinstance(arg, ast.Constant) and arg.value == "\n"
                    for arg in node.args
                )
            )
        )
    ]
    assert not splitting
    assert not hasattr(Fix, "parse")


def test_only_the_output_sink_prints():
    # Every command prints through entrypoints/output.py (human, JSON or
    # quiet); the serve-flags table's generator lives in the harness.
    sink = REPO / PACKAGE / "entrypoints" / "output.py"
    printing = sorted(
        (str(path.relative_to(REPO)), node.lineno)
        for path in (REPO / PACKAGE).rglob("*.py")
        if path != sink
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(node, ast.Call)
        and (
            (isinstance(node.func, ast.Name) and node.func.id == "print")
            or (
                isinstance(node.func, ast.Attribute)
                and node.func.attr == "write"
                and ast.unparse(node.func.value) in ("sys.stdout", "sys.stderr")
            )
        )
    )
    assert not printing
    sink_tree = ast.parse(sink.read_text(encoding="utf-8"))
    assert "sys.stdout" in ast.unparse(sink_tree)


ROLES = {
    # Root modules by role; subpackages are their own.
    "_log": "util",
    "envs": "util",
    "_versions": "util",
    "_import_hooks": "util",
    "verdict_text": "verdict_text",
    "selftest": "selftest",
    "selftest_gate": "selftest",
    "selftest_writer": "selftest",
    "selftest_judge": "selftest",
    "patches": "patching",
    "patch_sites": "patching",
    "": "patching",  # the package root: register()
    "__main__": "__main__",
}
LAYERS = (
    {"util"},
    {"config"},
    {"verdict_text", "v1", "model_executor"},
    {"selftest"},
    {"patching"},
    {"entrypoints"},
    {"__main__"},
)
"""Bottom to top: a module imports only from its own layer or below."""


def test_the_package_is_layered():
    def role(module: str) -> str:
        first = module.removeprefix(PACKAGE).removeprefix(".").split(".")[0]
        return ROLES.get(first, first)

    layer = {name: depth for depth, names in enumerate(LAYERS) for name in names}
    graph = import_graph()
    assert {role(name) for name in graph} == set(layer)
    upward = [
        (name, target)
        for name, targets in graph.items()
        for target in targets
        if layer[role(target)] > layer[role(name)]
    ]
    assert not upward
