"""The README and docs/ say only what is true: a one-page README, every
message quoted is one the code prints, every command runs as written."""

from __future__ import annotations

import ast
import dataclasses
import importlib.util
import itertools
import json
import re
import shlex
import subprocess
import sys

import pytest

from vllm_minimax_m3_kv._versions import vllm_source_root
from vllm_minimax_m3_kv.config.indexer_precision import decide
from vllm_minimax_m3_kv.config.pool_facts import (
    AITER_ENV,
    SHUFFLE_KV_ENV,
    PlatformFacts,
    PoolLayers,
    PrecisionFacts,
    SparseShape,
)
from vllm_minimax_m3_kv.config.verdicts import MIXED_POOL_HAZARD
from vllm_minimax_m3_kv.entrypoints.check.early import vllm_kv_cache_dtypes
from vllm_minimax_m3_kv.entrypoints.check.stock_vllm import (
    VLLM_CANNOT_BUILD,
    bf16_pool_vllm_cannot_build,
)
from vllm_minimax_m3_kv_sim import REPO
from vllm_minimax_m3_kv_sim.plumbing.children import json_from_stdout

DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
PACKAGE = REPO / "vllm_minimax_m3_kv"

QUOTED_FROM_VLLM = {
    "Unknown vLLM environment variable detected: VLLM_MINIMAX_M3_KV_ALLOW_MIXED": (
        "Unknown vLLM environment variable detected: "
    ),
}
"""Messages the docs quote from vLLM itself -> the text vLLM's source holds."""


def _normal(text: str) -> str:
    return " ".join(text.split())


def _source_strings() -> list[str]:
    """Every string literal in the package; an f-string's or a %-format's
    placeholders become a NUL, which no quoted fragment may span."""
    found = []
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.JoinedStr):
                found.append(
                    "".join(
                        part.value if isinstance(part, ast.Constant) else "\0"
                        for part in node.values
                    )
                )
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                found.append(re.sub(r"%[sdr]", "\0", node.value))
    return found


def _policy_messages() -> list[str]:
    """What decide() prints over a grid of every platform kind, every vLLM KV
    dtype and indexer, the opt-in, layouts, lengths, shapes and drafters."""
    # vLLM's KV_CACHE_DTYPES, read from its source as check reads it (a test
    # in test_check_front.py checks they agree) without importing vLLM here.
    kv_cache_dtypes = vllm_kv_cache_dtypes()
    assert kv_cache_dtypes
    platforms = []
    # As the live hook names the GPU, and as check names a --target.
    for name in ("ROCm gfx950", "ROCm gfx950 (MI355X)"):
        rocm = PlatformFacts(
            name,
            "rocm",
            rocm_gfx950=True,
            aiter_enabled=True,
            shuffle_kv_cache_layout=True,
        )
        off = dataclasses.replace(
            rocm, aiter_enabled=False, shuffle_kv_cache_layout=False
        )
        platforms += [
            rocm,
            off,
            dataclasses.replace(off, unset_env=frozenset({AITER_ENV, SHUFFLE_KV_ENV})),
            dataclasses.replace(rocm, aiter_installed=False, aiter_msa_kernels=False),
            dataclasses.replace(rocm, aiter_msa_kernels=False),
        ]
    platforms += [
        PlatformFacts(
            "ROCm gfx942 (MI300X)",
            "rocm",
            aiter_enabled=True,
            shuffle_kv_cache_layout=True,
        ),
        PlatformFacts("CUDA sm_103", "cuda", cuda_supports_fp8=True),
        PlatformFacts("CUDA sm_80", "cuda"),
    ]
    published = PoolLayers(num_layers=5, sparse=frozenset({3, 4}))
    layouts = [
        published,
        dataclasses.replace(published, skip_requested=frozenset({0})),
        dataclasses.replace(published, skip_requested=frozenset({4})),
        dataclasses.replace(
            published, skip_requested=frozenset({0, 1}), pp_stage_starts=(0, 3)
        ),
        PoolLayers(num_layers=5, sparse=frozenset()),
    ]
    messages = []
    for platform, kv, indexer, allow_mixed, layers in itertools.product(
        platforms,
        kv_cache_dtypes,
        ["auto", "bf16", "fp8", "mxfp4"],
        [False, True],
        layouts,
    ):
        for extra in (
            {},
            {"max_model_len": 2_000_000},
            # Two KV heads per rank: AITER sparse PA keeps vLLM's Triton
            # indexer out, so the MSA indexer's own limits are what refuse.
            {"max_model_len": 2_000_000, "kv_heads_per_rank": 2},
            {"shape": SparseShape(topk_blocks=32)},
            {"indexer_cp": True},
            {"model_dtype": "float16"},
            {"draft_kv_cache_dtype": "auto"},
            # A checkpoint that declares this KV dtype, with --kv-cache-dtype auto.
            {
                "kv_cache_flag": "auto",
                "kv_cache_source": "compressed-tensors kv_cache_scheme",
                "auto_kv_cache_dtype": kv,
            },
        ):
            facts = PrecisionFacts(
                platform=platform,
                kv_cache_dtype=kv,
                indexer_kv_dtype=indexer,
                max_model_len=extra.pop("max_model_len", 8192),
                tensor_parallel_size=8,
                allow_mixed=allow_mixed,
                layers=layers,
                **extra,
            )
            verdict = decide(facts)
            messages += [
                verdict.message,
                f"MiniMax-M3 {verdict.reason}.",
                *verdict.notes,
            ]
            if (unbuildable := bf16_pool_vllm_cannot_build(facts)) is not None:
                messages.append(unbuildable.message)
    return messages


@pytest.fixture(scope="module")
def corpus() -> list[str]:
    # Messages composed of constants at import (the plugin's name, the vLLM
    # range it supports) are read as the code composed them.
    from vllm_minimax_m3_kv import _versions

    composed = {v for v in vars(_versions).values() if isinstance(v, str)}
    return [
        _normal(text) for text in {*_source_strings(), *_policy_messages(), *composed}
    ]


def _quotes(text: str) -> list[str]:
    """Messages the docs quote: bold quotes, and message lines in text blocks."""
    quoted = [_normal(q) for q in re.findall(r'\*\*"(.+?)"\*\*', text, re.S)]
    for block in re.findall(r"```text\n(.*?)```", text, re.S):
        for line in block.splitlines():
            if line.startswith(LOG_LINES):
                continue  # doc_log_lines(): checked against a real log
            if line.lstrip().startswith(
                ("MiniMax-M3", "vllm-minimax-m3-kv", "Fix with one of", "VLLM_", "--")
            ):
                quoted.append(_normal(line))
    return quoted


LOG_LINES = ("vllm-minimax-m3-kv active:", "MiniMax-M3 KV pool:")
"""Lines the docs show as a live server logs them, values included: checked
verbatim against a real plugin's log in ``tests/test_plugin_load.py``."""


def doc_log_lines() -> list[str]:
    lines = []
    for doc in DOCS:
        for block in re.findall(r"```text\n(.*?)```", doc.read_text(), re.S):
            lines += [line for line in block.splitlines() if line.startswith(LOG_LINES)]
    return lines


def _printed(quote: str, corpus: list[str]) -> bool:
    """Whether the quote's fragments (``...`` elides values) appear, in order,
    in one message; a fragment cannot span a value filled in when printed."""
    fragments = [f.strip() for f in quote.split("...") if f.strip()]
    for text in corpus:
        position = 0
        for fragment in fragments:
            position = text.find(fragment, position)
            if position < 0:
                break
            position += len(fragment)
        else:
            return True
    return False


def test_every_fix_line_pastes_into_bash(tmp_path):
    """Each fix line decide() can print is shell: `bash -n` parses it, and
    what it does is a comment."""
    lines = {
        line.strip()
        for message in _policy_messages()
        if "Fix with one of:" in message
        for line in message.split("Fix with one of:", 1)[1].strip().splitlines()
    }
    assert len(lines) > 20 and all("#" in line for line in lines)
    script = tmp_path / "fixes.sh"
    for line in sorted(lines):
        script.write_text(line + "\n")
        proc = subprocess.run(
            ["bash", "-n", str(script)], capture_output=True, text=True
        )
        assert proc.returncode == 0, (line, proc.stderr)


REFUSAL_STARTS = ("MiniMax-M3 KV precision:", VLLM_CANNOT_BUILD)


def test_a_refusal_says_what_where_and_why_in_one_short_first_line():
    """The first line of every refusal decide() (or check's bf16 build
    report) can print is one sentence under about 200 characters; causes
    follow on their own lines, and the mixed-pool hazard, with its docs link,
    once on its own line where the pool would be mixed."""
    refusals = {m for m in _policy_messages() if m.startswith(REFUSAL_STARTS)}
    assert len(refusals) > 1000
    hazard = MIXED_POOL_HAZARD
    assert "(docs/mixed-pools.md)" in hazard
    with_hazard = 0
    for message in refusals:
        first, *rest = message.split("Fix with one of:")[0].strip().splitlines()
        assert len(first) <= 200 and first.endswith("."), first
        assert hazard not in first and message.count(hazard) <= 1, message
        if hazard in message:
            with_hazard += 1
            assert hazard in rest, message
    assert 0 < with_hazard < len(refusals)


def test_reliability_figures_are_the_codes():
    """The KV dtype count, the matrix sizes and the table's total in
    docs/reliability.md are what the code defines today."""
    counts = json_from_stdout(["-m", "tests.reliability.counts"])
    text = _normal((REPO / "docs" / "reliability.md").read_text())
    assert f"`KV_CACHE_DTYPES` ({counts['kv_cache_dtypes']} in vLLM 0.33" in text
    assert f"Quick is {counts['quick']:,} cells, full {counts['full']:,}" in text
    total = re.search(r"\| total \| ([\d,]+) \|", text)
    table_total = int(total.group(1).replace(",", "")) if total else None
    assert table_total == counts["full"] + counts["partial_install"], total


def _collected(*args: str) -> int:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "--collect-only",
            "-q",
            "-p",
            "no:cacheprovider",
            *args,
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=600,
    )
    found = re.search(r"(\d+)(?:/\d+)? tests? collected", proc.stdout)
    assert found, proc.stdout[-2000:] + proc.stderr[-2000:]
    return int(found[1])


def test_the_readme_test_and_install_figures_are_this_trees():
    """README's test counts are what pytest collects here, and every time and
    size it gives for the install and the tests is one docs/testing.md
    records as measured (where, when, how)."""
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    install = readme.split("## Install", 1)[1].split("```", 1)[0]
    tests = readme.split("The tests (CPU only", 1)[1].split("```", 1)[0]
    count = int(re.search(r"; (\d+) tests, which ran in", tests)[1])
    fast = int(re.search(r"`-m fast`: the (\d+)\s", tests)[1])
    assert (count, fast) == (_collected(), _collected("-m", "fast"))
    figures = re.findall(r"\d+(?:\.\d+)? (?:GB|min|s)\b", install + tests)
    assert len(figures) >= 4, figures
    testing = (REPO / "docs" / "testing.md").read_text(encoding="utf-8")
    measured = testing.split("## Figures in the README", 1)[1]
    assert [f for f in figures if f not in measured] == []


def test_readme_is_one_page():
    assert len((REPO / "README.md").read_text().splitlines()) <= 150


def test_every_quoted_message_is_one_the_code_prints(corpus):
    missing = []
    for doc in DOCS:
        for quote in _quotes(doc.read_text(encoding="utf-8")):
            if quote in QUOTED_FROM_VLLM:
                continue
            if not _printed(quote, corpus):
                missing.append(f"{doc.name}: {quote}")
    assert not missing, "\n".join(missing)


def test_quotes_from_vllm_are_in_vllm():
    vllm = vllm_source_root()
    sources = "\n".join(p.read_text(errors="replace") for p in vllm.rglob("*.py"))
    for held in QUOTED_FROM_VLLM.values():
        assert held in sources, held


def test_the_old_invented_message_would_be_caught(corpus):
    # What an earlier README quoted and no code printed.
    assert not _printed("every MiniMax-M3 fp8 indexer stores e4m3", corpus)
    assert _printed(
        "MiniMax-M3 KV pool: one precision (...) on all ... workers", corpus
    )
    assert doc_log_lines()  # the docs show the live lines


# -- every command in the docs runs as written --------------------------------

EXTERNAL = {
    "git": "needs this repository's remote; run by hand and in CI (.ci/run)",
    "python3.11": "creates the virtual environment; CI (.ci/run) does the same",
    "pip": "installs; CI (.ci/run) installs with pip install -e '.[test]'",
    ".": "activates the virtual environment",
    "cd": "changes into a vLLM checkout (docs/upstream.md)",
    "pytest": "runs vLLM's own tests in a vLLM checkout (docs/upstream.md)",
}
RUN_ELSEWHERE = {
    "python -m pytest -q -n 2": ".ci/run runs it verbatim",
}


def _commands() -> list[tuple[str, list[str]]]:
    commands = []
    for doc in DOCS:
        for block in re.findall(r"```bash\n(.*?)```", doc.read_text(), re.S):
            for line in block.replace("\\\n", " ").splitlines():
                line = line.split("  #", 1)[0].strip()
                if line.startswith("#"):
                    continue
                for part in re.split(r"\s*&&\s*", line):
                    if part:
                        commands.append((doc.name, shlex.split(part)))
    return commands


def _without_env(words: list[str]) -> list[str]:
    """The command after its leading ``NAME=value`` assignments."""
    while words and re.match(r"^[A-Z_][A-Z0-9_]*=", words[0]):
        words = words[1:]
    return words


def test_every_command_in_the_docs_runs_as_written(tmp_path):
    to_parse = []  # (argv for vLLM's serve parser), checked in one child
    for doc, words in _commands():
        words = _without_env(words)
        line = " ".join(words)
        program = words[0]
        if line in RUN_ELSEWHERE or program in EXTERNAL:
            continue
        if program == "vllm-minimax-m3-kv" and words[1:2] == ["bench"]:
            to_parse.append(["bench", *words[2:]])
        elif program == "vllm-minimax-m3-kv" or words[:3] == [
            "python",
            "-m",
            "vllm_minimax_m3_kv",
        ]:
            to_parse.append(["check", *words[words.index("check") + 1 :]])
        elif program == "vllm":
            assert words[1] == "serve", (doc, line)
            to_parse.append(["serve", *words[2:]])
        elif program == "python" and words[1] == "-m":
            module = words[2]
            assert importlib.util.find_spec(module) is not None, (doc, line)
            to_parse.append(["module", module, *words[3:]])
        elif program in ("python", "python3") and words[1].startswith("scripts/"):
            assert (REPO / words[1]).is_file(), (doc, line)
            to_parse.append(["pyscript", words[1], *words[2:]])
        elif program.startswith("scripts/"):
            script = REPO / program
            assert script.is_file() and script.stat().st_mode & 0o111, (doc, line)
            to_parse.append(["script", program, *words[1:]])
        else:
            raise AssertionError(f"{doc}: no way to check {line!r}")
    cases = tmp_path / "commands.json"
    cases.write_text(json.dumps(to_parse))
    problems = json_from_stdout(["-m", "tests.doc_commands", str(cases)])
    assert problems == [], problems


def test_startup_cost_table_was_measured_on_the_current_load_path():
    # docs/performance.md's startup table is written by the benchmark with a
    # fingerprint of the sources it measured; changing the plugin's load path
    # or hook without rerunning it leaves a stale fingerprint.
    from benchmarks.plugin_overhead import BLOCK, DOCS, sources_fingerprint

    (block,) = BLOCK.finditer(DOCS.read_text())
    assert block["fingerprint"] == sources_fingerprint(), (
        "the plugin's load path or hook changed since docs/performance.md's "
        "startup table was measured: python -m benchmarks.plugin_overhead "
        "--write-docs"
    )


NO_ZEROER_CLAIM = re.compile(
    r"needs? no (?:zeroer|zeroing)|no zeroer (?:is )?needed|zeroer is not needed"
    r"|(?:does not|doesn't) need (?:a|the) zeroer|removes? (?:a|the) zeroer",
    re.IGNORECASE,
)
KERNELS_NAMED = ("Triton", "AITER MSA", "fmha_sm100")


def test_every_no_zeroer_claim_names_the_kernels_it_was_shown_on():
    """Stale bytes were shown harmless in vLLM's Triton kernels (interpreter)
    only; AITER MSA and fmha_sm100 never ran here. A paragraph that says a
    zeroer is not needed says which (issue #31)."""
    texts = [*DOCS, *sorted((REPO / "upstream").glob("*.md"))]
    unqualified = []
    for path in texts:
        for paragraph in re.split(r"\n\s*\n", path.read_text(encoding="utf-8")):
            if NO_ZEROER_CLAIM.search(paragraph):
                missing = [k for k in KERNELS_NAMED if k not in paragraph]
                if missing:
                    unqualified.append((path.name, missing, _normal(paragraph)[:160]))
    assert not unqualified, unqualified
    assert any(NO_ZEROER_CLAIM.search(p.read_text()) for p in texts)  # live


# The headings of vLLM's PR template, in order (`.github/PULL_REQUEST_TEMPLATE.md`
# in the v0.33.0 source release); a text may add its own between them.
PR_TEMPLATE_HEADINGS = ("## Overview", "## Claims", "## Validation", "## Details")


UPSTREAM_TEXTS = sorted((REPO / "upstream").glob("*.md"))


def test_the_upstream_texts_are_found():
    assert len(UPSTREAM_TEXTS) >= 3, UPSTREAM_TEXTS  # else the case below runs on none


@pytest.mark.parametrize("text", UPSTREAM_TEXTS, ids=lambda path: path.name[:2])
def test_every_upstream_text_has_vllms_pr_template_headings_in_order(text):
    headings = [
        line.strip() for line in text.read_text().splitlines() if line.startswith("## ")
    ]
    assert [h for h in headings if h in PR_TEMPLATE_HEADINGS] == list(
        PR_TEMPLATE_HEADINGS
    ), headings
