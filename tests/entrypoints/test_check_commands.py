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
from vllm_minimax_m3_kv.entrypoints.check.batch import SKIPPED, Row, exit_code
from vllm_minimax_m3_kv.entrypoints.check.script import (
    CommandLine,
    NotServe,
    Serve,
    command_lines,
    read_script,
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


def test_a_script_is_read_as_bash_runs_it():
    """export, declare -x, unset, set -a, plain assignments (exported only
    where bash exports them), env and prefix words, $VAR expansion,
    redirections, pipes and lists: each serve command gets what bash gives it."""
    script = (
        "#!/usr/bin/env bash\n"
        "set -euo pipefail\n"
        "export VLLM_ROCM_USE_AITER=1 TP=4\n"
        "declare -x VLLM_ROCM_SHUFFLE_KV_CACHE_LAYOUT=1\n"
        "VLLM_USE_BREAKABLE_CUDAGRAPH=0\n"  # a shell variable: not exported
        'echo "starting MiniMax-M3"\n'
        "vllm serve m --kv-cache-dtype fp8 -tp $TP > server.log 2>&1 &\n"
        "unset VLLM_ROCM_USE_AITER\n"
        "cd /srv && env -u VLLM_ROCM_SHUFFLE_KV_CACHE_LAYOUT A=1 vllm serve m | tee x\n"
        "set -a\n"
        "VLLM_ROCM_USE_AITER=0\n"  # exported under set -a
        "nohup /opt/venv/bin/vllm serve m --max-model-len ${LEN:-8192}\n"
        "python3 -m sglang.launch_server --model-path m\n"
        "vllm serve m -tp $UNSET_IN_FILE_AND_HERE\n"
        "vllm serve $(cat model.txt)\n"
    )
    entries = read_script(script)
    found = [(command.number, entry) for command, entry in entries]
    aiter, shuffle = "VLLM_ROCM_USE_AITER", "VLLM_ROCM_SHUFFLE_KV_CACHE_LAYOUT"
    assert found[:2] == [
        (6, NotServe("not a vllm serve line")),
        (
            7,
            Serve(
                ["m", "--kv-cache-dtype", "fp8", "-tp", "4"],
                {aiter: "1", "TP": "4", shuffle: "1"},
                unexported=("VLLM_USE_BREAKABLE_CUDAGRAPH",),
            ),
        ),
    ]
    assert found[2] == (9, NotServe("not a vllm serve line"))  # cd
    assert found[3][0] == 9 and found[3][1].env[shuffle] is None
    assert found[3][1].env["A"] == "1" and found[3][1].env[aiter] is None
    assert found[3][1].argv == ["m"]
    assert found[4][0] == 12 and found[4][1].env[aiter] == "0"
    assert found[4][1].argv == ["m", "--max-model-len", "8192"]
    assert found[5] == (13, NotServe("not a vllm serve line"))
    assert found[6][0] == 14 and found[6][1].may_be_serve
    assert "$UNSET_IN_FILE_AND_HERE is set neither" in found[6][1].why
    assert found[7][0] == 15 and "runs a command" in found[7][1].why
    assert len(found) == 8


def test_skipped_lines_count_for_nothing_and_unjudged_serve_lines_do():
    skipped = Row(2, None, SKIPPED, why="not a vllm serve line")
    assert exit_code([Row(1, EXIT_OK, "inherited"), skipped]) == EXIT_OK
    assert exit_code([Row(1, EXIT_REFUSED, "error"), skipped]) == EXIT_REFUSED
    assert exit_code([Row(1, None, "not judged"), skipped]) == EXIT_UNJUDGED


MI300X_SCRIPT = """\
#!/usr/bin/env bash
export VLLM_ROCM_USE_AITER=1
export VLLM_ROCM_SHUFFLE_KV_CACHE_LAYOUT=1
echo "MiniMax-M3 on MI300X"
vllm serve MiniMaxAI/MiniMax-M3 --kv-cache-dtype fp8 --block-size 128 \\
  --tensor-parallel-size 4 --language-model-only --attention-backend TRITON_ATTN
python3 -m sglang.launch_server --model-path MiniMaxAI/MiniMax-M3 --tp 4
"""


def test_an_mi300x_script_with_exports_is_refused_as_serve_refuses_it(tmp_path):
    """The exports reach the serve line (MI300X beside AITER sparse PA is
    refused), the other lines are skipped, the file exits 2."""
    path = tmp_path / "mi300x.sh"
    path.write_text(MI300X_SCRIPT)
    check = [*CHECK[:-1], "mi300x", "--commands", str(path)]
    proc = run_python(check, {}, 300)
    assert "Traceback" not in proc.stderr, proc.stderr
    rows = _rows(proc.stdout)
    assert [row[:3] for row in rows] == [
        ["4", "-", SKIPPED],
        ["5", "2", "error"],
        ["7", "-", SKIPPED],
    ], proc.stdout
    assert rows[0][5] == rows[2][5] == "not a vllm serve line"
    fixes = proc.stdout.split("line 5: fix with one of:\n", 1)[1]
    assert (
        "VLLM_ROCM_SHUFFLE_KV_CACHE_LAYOUT=0 vllm serve MiniMaxAI/MiniMax-M3" in fixes
    )
    assert proc.returncode == EXIT_REFUSED


def _with_exports(recipe: str, env: dict[str, str], unset: list[str]) -> str:
    lines = [f"export {name}={value}" for name, value in env.items()]
    return "\n".join([*lines, *(f"unset {name}" for name in unset), recipe]) + "\n"


@pytest.mark.parametrize(
    ("target", "recipe", "env", "unset"),
    [
        (
            "mi355x",
            None,  # docs/deploying.md's, as InferenceX's script runs it
            {
                "VLLM_ENGINE_READY_TIMEOUT_S": "3600",
                "VLLM_USE_BREAKABLE_CUDAGRAPH": "0",
            },
            ["VLLM_ROCM_USE_AITER", "VLLM_ROCM_SHUFFLE_KV_CACHE_LAYOUT"],
        ),
        (
            "b300",
            "vllm serve MiniMaxAI/MiniMax-M3 --port 8000 --tensor-parallel-size 4 "
            "--block-size 128 --language-model-only --max-model-len 16384 "
            "--kv-cache-dtype fp8 --attention-config.indexer_kv_dtype fp8",
            {"VLLM_ENGINE_READY_TIMEOUT_S": "3600"},
            [],
        ),
    ],
)
def test_the_public_recipes_written_with_exports_start(
    tmp_path, target, recipe, env, unset
):
    path = tmp_path / f"{target}.sh"
    path.write_text(_with_exports(recipe or _public_mi355x_recipe(), env, unset))
    check = [*CHECK[:-1], target, "--commands", str(path), "--json"]
    # AITER set in the caller's shell: the script's unset wins, as in bash.
    proc = run_python(check, {"VLLM_ROCM_USE_AITER": "1"}, 300)
    report = json.loads(proc.stdout)
    assert proc.returncode == EXIT_OK == report["exit"], proc.stdout + proc.stderr
    (row,) = report["rows"]
    assert row["outcome"] == ("inherited" if target == "mi355x" else "uniform")
    assert row["indexer_kv_dtype"] == "fp8"
    assert {k: v for k, v in row["env"].items() if v is not None} == env
    assert all(row["env"][name] is None for name in unset)


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
