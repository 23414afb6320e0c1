"""The plugin guide's one-file path runs as written: its code and its command, read from plugins/README.md."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

GUIDE = Path(__file__).resolve().parents[2] / "plugins" / "README.md"
# A small GRPO recipe: the guide's `recipe.yaml` ("a GRPO recipe such as examples/grpo_arith.yaml").
RECIPE = textwrap.dedent(
    """\
    name: my_loss_try
    algorithm:
      type: grpo
    buffer:
      tasks:
        generator: arithmetic
    """
)
TINY = [
    "model.path=tiny-random",
    "trainer.engine=local",
    "trainer.total_steps=2",
    "trainer.micro_batch_size=3",
    "explorer.batch_size=2",
    "explorer.group_size=4",
    "monitor.progress=false",
]


def code_blocks(text: str, lang: str) -> list[str]:
    return re.findall(rf"^```{lang}\n(.*?)^```", text, flags=re.S | re.M)


def guide_loss_file() -> str:
    """The ```python block of the guide that starts with `# my_loss.py`, verbatim."""
    (block,) = [b for b in code_blocks(GUIDE.read_text(), "python") if b.startswith("# my_loss.py\n")]
    return block


def guide_command() -> list[str]:
    """The guide's `trinity-like run ... --plugin my_loss.py ...` line, split like a shell would."""
    lines = [
        ln
        for b in code_blocks(GUIDE.read_text(), "bash")
        for ln in b.splitlines()
        if ln.startswith("trinity-like run ") and "--plugin my_loss.py" in ln
    ]
    (line,) = lines
    return shlex.split(line)


def cli(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    assert args[0] == "trinity-like"  # the console script, run with this interpreter
    env = {**os.environ, "RAY_AUTH_MODE": "disabled"}
    env.pop("TRINITY_LIKE_PLUGINS", None)
    return subprocess.run(
        [sys.executable, "-m", "trinity_like.cli", *args[1:]],
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd,
        timeout=600,
    )


def test_the_guide_shows_the_command_the_test_runs():
    assert guide_command() == [
        "trinity-like",
        "run",
        "--config",
        "recipe.yaml",
        "--plugin",
        "my_loss.py",
        "algorithm.policy_loss.name=my_loss",
    ]
    assert '@POLICY_LOSS_FN.register_module("my_loss")' in guide_loss_file()


def test_the_guides_dry_run_line_is_what_dry_run_prints(tmp_path):
    (tmp_path / "my_loss.py").write_text(guide_loss_file())
    (tmp_path / "recipe.yaml").write_text(RECIPE)
    out = cli(guide_command() + ["--dry-run"], tmp_path)
    assert out.returncode == 0, out.stderr
    (shown,) = re.findall(r"`(policy_loss: my_loss \(swapped;[^`]*)`", GUIDE.read_text())
    assert f"    {shown}\n" in out.stdout, out.stdout


@pytest.mark.slow
def test_the_guides_one_file_loss_trains_two_steps(tmp_path):
    (tmp_path / "my_loss.py").write_text(guide_loss_file())
    (tmp_path / "recipe.yaml").write_text(RECIPE)
    out = cli(guide_command() + [f"run_root={tmp_path / 'runs'}", *TINY], tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    run_dir = tmp_path / "runs" / "my_loss_try"
    assert json.loads((run_dir / "config.json").read_text())["algorithm"]["policy_loss"] == {"name": "my_loss"}
    rows = [json.loads(ln) for ln in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "time/step" in r]
    assert [r["step"] for r in steps] == [1, 2]
    assert all(isinstance(r["policy_loss"], float) for r in steps), steps


# -- the registry list and the environment section ------------------------------------------------
def test_the_guides_registry_list_is_every_registry():
    from trinity_like.registry import REGISTRIES

    text = " ".join(GUIDE.read_text().split())
    (listed,) = re.findall(r"The registries are: ([A-Z_, ]+) \(`trinity-like list` prints them all", text)
    assert [name.strip() for name in listed.split(",")] == list(REGISTRIES)


def guide_block(first_line: str, lang: str = "python") -> str:
    """The one ``lang`` block of the guide whose first line is ``first_line`` (or that holds it)."""
    (block,) = [b for b in code_blocks(GUIDE.read_text(), lang) if first_line in b]
    return block


def guide_env_commands() -> list[list[str]]:
    lines = [ln for ln in guide_block("--plugin my_env.py", "bash").splitlines() if ln.strip()]
    return [shlex.split(ln) for ln in lines]


def test_the_guides_env_is_listed_and_trains_two_steps_from_a_recipe(tmp_path):
    (tmp_path / "my_env.py").write_text(guide_block("# my_env.py"))
    recipe = (GUIDE.parents[1] / "examples" / "multiturn_tool.yaml").read_text()  # "such as" the env recipe
    (tmp_path / "recipe.yaml").write_text(recipe)
    listing, run = guide_env_commands()
    assert listing == ["trinity-like", "list", "env", "--plugin", "my_env.py"]
    assert run[:6] == ["trinity-like", "run", "--config", "recipe.yaml", "--plugin", "my_env.py"]
    out = cli(listing, tmp_path)
    assert out.returncode == 0, out.stderr
    assert re.search(r"\n  echo +Reply with the task's answer, exactly", out.stdout), out.stdout
    tiny = [
        f"run_root={tmp_path / 'runs'}",
        *TINY,
        "buffer.eval_tasks.size=4",
        "checkpoint.interval=2",
        "algorithm.dynamic_sampling=false",
    ]
    out = cli(run + tiny, tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    run_dir = tmp_path / "runs" / "multiturn_tool"
    assert json.loads((run_dir / "config.json").read_text())["explorer"]["workflow_args"]["env"] == "echo"
    rows = [json.loads(ln) for ln in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "time/step" in r]
    assert [r["step"] for r in steps] == [1, 2]
    # a random model never repeats the answer: env/exact is logged as 0 (declared), not left out
    assert all(r["env/exact"] == 0.0 and 1 <= r["rollout/turns/mean"] <= 2 for r in steps), steps
    evals = [r for r in rows if "eval/accuracy" in r]
    assert [r["step"] for r in evals] == [0, 2] and all("eval/env/exact" in r for r in evals)


def test_the_guides_client_loop_trains_the_plugin_env(tmp_path):
    (tmp_path / "my_env.py").write_text(guide_block("# my_env.py"))
    code = guide_block('load_plugins(["my_env.py"])')
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "RAY_AUTH_MODE": "disabled"}
    env.pop("TRINITY_LIKE_PLUGINS", None)
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, env=env, timeout=600
    )
    assert out.returncode == 0, out.stderr[-3000:]
    accuracy, exact = (float(x) for x in out.stdout.split()[-2:])
    assert 0 <= accuracy <= 1 and exact == accuracy  # the reward is the exact match the env reports
    rows = [json.loads(ln) for ln in (tmp_path / "runs" / "echo" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2] and all("env/exact" in r for r in rows[1:])
