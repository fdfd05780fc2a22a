"""``check --commands FILE`` on files as operators write them: the public
recipe with backslash continuations, comments, environment prefixes, and
lines that cannot be read or judged."""

from __future__ import annotations

import json
import re

import pytest

from vllm_minimax_m3_kv.entrypoints.check.arguments import (
    EXIT_MIXED,
    EXIT_OK,
    EXIT_REFUSED,
    EXIT_UNJUDGED,
    EXIT_USAGE,
)
from vllm_minimax_m3_kv.entrypoints.check.batch import (
    CommandLine,
    Row,
    command_lines,
    exit_code,
    split_command,
)
from vllm_minimax_m3_kv_sim import REPO
from vllm_minimax_m3_kv_sim.plumbing.children import run_python

CHECK = ["-m", "vllm_minimax_m3_kv", "check", "--target", "mi355x"]


def _public_mi355x_recipe() -> str:
    """The serve command docs/deploying.md prints, as printed (continuations)."""
    text = (REPO / "docs" / "deploying.md").read_text(encoding="utf-8")
    block = re.search(r"```bash\n(vllm serve MiniMaxAI/MiniMax-M3 [^`]*?)```", text)
    assert block and "\\\n" in block[1], "the recipe in docs/deploying.md moved"
    return block[1]


def test_continuations_join_and_comments_and_blanks_are_skipped():
    text = (
        "# a comment \\\n"
        "\n"
        "A=1 vllm serve --x 1 \\\n"
        "    --y 2\n"
        "   # indented comment\n"
        "vllm serve --z 'a b' # trailing comment\n"
        "vllm serve --w \\\\\n"  # an escaped backslash ends the line
        "vllm serve --v \\"  # the file ends inside a continuation
    )
    assert command_lines(text) == [
        CommandLine(3, "A=1 vllm serve --x 1     --y 2"),
        CommandLine(6, "vllm serve --z 'a b' # trailing comment"),
        CommandLine(7, "vllm serve --w \\\\"),
        CommandLine(8, "vllm serve --v "),
    ]
    assert split_command(command_lines(text)[0].text) == (
        {"A": "1"},
        ["--x", "1", "--y", "2"],
    )
    with pytest.raises(ValueError, match="No closing quotation"):
        split_command("vllm serve --kv-cache-dtype 'fp8")


def test_the_public_recipe_is_one_command():
    (command,) = command_lines(_public_mi355x_recipe())
    env, argv = split_command(command.text)
    assert env == {} and argv[0] == "MiniMaxAI/MiniMax-M3"
    assert "--reasoning-parser" in argv and "\\" not in argv


@pytest.mark.parametrize(
    ("exits", "expected"),
    [
        ([EXIT_OK, EXIT_OK], EXIT_OK),
        ([EXIT_OK, EXIT_MIXED], EXIT_MIXED),
        ([EXIT_MIXED, EXIT_REFUSED, EXIT_OK], EXIT_REFUSED),
        # A line that could not be judged never hides a verdict...
        ([EXIT_REFUSED, EXIT_USAGE, None], EXIT_REFUSED),
        ([EXIT_MIXED, None], EXIT_MIXED),
        # ...and is told apart from a clean file when all else starts uniform.
        ([EXIT_OK, EXIT_USAGE], EXIT_UNJUDGED),
        ([None], EXIT_UNJUDGED),
    ],
)
def test_the_exit_code_is_the_worst_verdict(exits, expected):
    rows = [Row(number, code, "") for number, code in enumerate(exits, 1)]
    assert exit_code(rows) == expected


def _rows(stdout: str) -> list[list[str]]:
    return [
        [cell.strip() for cell in line.strip().strip("|").split("|")]
        for line in stdout.splitlines()
        if line.startswith("| ") and not line.startswith(("| line", "| ---"))
    ]


def test_commands_judges_a_real_deployment_file(tmp_path):
    recipe = _public_mi355x_recipe()
    deployments = tmp_path / "deployments.txt"
    deployments.write_text(
        "# today's public MI355X recipe, as docs/deploying.md prints it\n"
        + recipe
        + "\n"
        "VLLM_ROCM_USE_AITER=1 VLLM_ROCM_SHUFFLE_KV_CACHE_LAYOUT=1 vllm serve "
        "--kv-cache-dtype fp8 -tp 8\n"
        "VLLM_MINIMAX_M3_KV_ALLOW_MIXED=1 vllm serve --kv-cache-dtype fp8 -tp 8 "
        "--attention-config.minimax_m3_indexer_cp true\n"
        "vllm serve --kv-cache-dtype fp8 -tp 8 \\\n"
        "    --attention-config.minimax_m3_indexer_cp true\n"
        "vllm serve --kv-cache-dtpye fp8\n"
        "vllm serve --kv-cache-dtype 'fp8\n"
    )
    first = 2
    after = first + recipe.count("\n") + 1  # the recipe, then a blank line
    proc = run_python([*CHECK, "--commands", str(deployments)], {}, 300)
    assert "Traceback" not in proc.stderr, proc.stderr
    rows = _rows(proc.stdout)
    assert [row[:3] for row in rows] == [
        [str(first), "0", "inherited"],
        [str(after), "0", "inherited"],
        [str(after + 1), "3", "mixed"],
        [str(after + 2), "2", "error"],
        [str(after + 4), "1", "not judged"],
        [str(after + 5), "-", "not judged"],
    ], proc.stdout
    assert "did you mean --kv-cache-dtype?" in rows[4][5]
    assert rows[5][5] == "unreadable: No closing quotation"
    # The refusal's fixes follow the table, as they paste into a shell.
    fixes = proc.stdout.split(f"line {after + 2}: fix with one of:\n", 1)[1]
    assert (
        "vllm serve MiniMaxAI/MiniMax-M3 --kv-cache-dtype fp8 -tp 8 "
        "--attention-config.minimax_m3_indexer_cp false  # keep the fp8 KV cache"
    ) in fixes
    # A refusal outranks the lines that could not be judged.
    assert proc.returncode == EXIT_REFUSED


def test_commands_json_and_the_unjudged_exit(tmp_path):
    deployments = tmp_path / "deployments.txt"
    deployments.write_text(
        "vllm serve --kv-cache-dtype fp8 -tp 8\nvllm serve --kv-cache-dtpye fp8\n"
    )
    proc = run_python([*CHECK, "--commands", str(deployments), "--json"], {}, 300)
    assert proc.returncode == EXIT_UNJUDGED, proc.stderr
    report = json.loads(proc.stdout)
    assert report["exit"] == EXIT_UNJUDGED
    assert [(row["line"], row["exit"], row["outcome"]) for row in report["rows"]] == [
        (1, 0, "inherited"),
        (2, 1, "not judged"),
    ]
