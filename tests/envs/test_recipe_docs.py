"""docs/envs.md's recipe section as written: its recipe is the example file, every key of it is
explained, its tables are the dataclasses they describe, its commands run (the training one on the
tiny model) and its `--dry-run` line is what the plan prints."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import yaml

from trinity_like.envs.rollout import RolloutParams
from trinity_like.envs.workflow import EnvWorkflowParams

ROOT = Path(__file__).resolve().parents[2]
DOC = (ROOT / "docs" / "envs.md").read_text()
EXAMPLE = ROOT / "examples" / "multiturn_tool.yaml"
SECTION = DOC.split("\n## In a recipe\n", 1)[1].split("\n## ", 1)[0]
LEAF_MAPPINGS = ("generator_args", "env_args")  # option mappings a key's row explains as a whole
TINY = [
    "model.path=tiny-random",
    "trainer.engine=local",
    "trainer.total_steps=2",
    "trainer.micro_batch_size=4",
    "buffer.eval_tasks.size=4",
    "explorer.batch_size=2",
    "explorer.group_size=4",
    "monitor.progress=false",
    "checkpoint.interval=2",
]


def block(lang: str) -> str:
    (found,) = re.findall(rf"^```{lang}\n(.*?)^```", SECTION, flags=re.S | re.M)
    return found


def table(header: str, text: str = SECTION) -> list[list[str]]:
    """The rows (cells stripped) of the markdown table whose header row starts with ``header``."""
    lines = text.split(header, 1)[1].splitlines()[2:]
    rows = []
    for line in lines:
        if not line.strip().startswith("|"):
            break
        rows.append([c.strip() for c in line.strip().strip("|").split("|")])
    return rows


def leaf_keys(data: dict, prefix: str = "") -> set[str]:
    out = set()
    for key, value in data.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict) and key not in LEAF_MAPPINGS:
            out |= leaf_keys(value, path + ".")
        else:
            out.add(path)
    return out


def cli(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    assert args[0] == "trinity-like"
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "HF_HUB_OFFLINE": "1"}
    env.pop("TRINITY_LIKE_PLUGINS", None)
    return subprocess.run(
        [sys.executable, "-m", "trinity_like.cli", *args[1:]],
        cwd=cwd,
        capture_output=True,
        text=True,
        env=env,
        timeout=900,
    )


def test_the_recipe_is_the_example_file():
    text = EXAMPLE.read_text()
    assert block("yaml") == text[text.index("name: multiturn_tool") :]


def test_every_key_of_the_recipe_is_explained():
    explained = {key for row in table("| key | what it does here |") for key in re.findall(r"`([\w.]+)`", row[0])}
    assert explained == leaf_keys(yaml.safe_load(block("yaml")))


def test_the_workflow_args_table_is_the_env_workflows_params():
    rows = table("| key | default | meaning |")
    fields = {f.name: f for f in dataclasses.fields(EnvWorkflowParams)}
    assert [r[0].strip("`") for r in rows] == list(fields)
    for name, default, _ in rows:
        f = fields[name.strip("`")]
        value = f.default_factory() if f.default is dataclasses.MISSING else f.default
        if name == "`max_total_tokens`":  # a recipe offers its own (config.engine_params.workflow_settings)
            assert default == "`model.max_prompt_tokens + model.max_response_tokens`"
        else:
            assert default.strip("`") == str(value), name


def test_the_rollout_params_table_is_the_dataclass():
    rows = table("| field | default | meaning |", DOC)
    assert [(r[0].strip("`"), r[1]) for r in rows] == [
        (f.name, str(f.default)) for f in dataclasses.fields(RolloutParams)
    ]


def test_the_dry_run_prints_the_docs_plan_line():
    dry, _ = (shlex.split(line.split("#")[0]) for line in block("bash").splitlines())
    assert dry == ["trinity-like", "run", "--config", "examples/multiturn_tool.yaml", "--dry-run"]
    out = cli(dry, ROOT)
    assert out.returncode == 0, out.stderr
    (shown,) = re.findall(r"^```\n(  explorer: .*)\n```", SECTION, flags=re.M)
    assert shown in out.stdout.splitlines(), out.stdout


def test_the_recipe_trains_two_steps_on_the_tiny_model(tmp_path):
    _, run = (shlex.split(line.split("#")[0]) for line in block("bash").splitlines())
    assert run == ["trinity-like", "run", "--config", "examples/multiturn_tool.yaml"]
    out = cli(run + [f"run_root={tmp_path}", *TINY], ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    run_dir = tmp_path / "multiturn_tool"
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "time/step" in r]
    assert [r["step"] for r in steps] == [1, 2]
    calculator = {"env/correct", "env/used_tool", "env/tool_calls", "env/tool_errors"}  # declared: every step
    assert all(calculator <= set(r) and r["rollout/episodes"] == 8 for r in steps), steps
    evals = [r for r in rows if "eval/accuracy" in r]
    assert [r["step"] for r in evals] == [0, 2]
    assert all({f"eval/{k}" for k in calculator} | {"eval/dropped", "eval/rollout/turns/mean"} <= set(r) for r in evals)
    answers = [json.loads(line) for line in (run_dir / "evals.jsonl").read_text().splitlines()]
    first = [a for a in answers if a["step"] == 0]
    assert len({a["task_id"] for a in first}) == len({a["prompt"] for a in first}) == 4
