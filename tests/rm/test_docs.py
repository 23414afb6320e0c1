"""docs/learned_rewards.md runs as written, shrunk to the tiny model: each command gets the
overrides that make it take seconds (model, steps, sample counts), nothing else."""

from __future__ import annotations

import json
import re
import shlex
import shutil
from pathlib import Path

import pytest
import yaml

from trinity_like.cli import main

ROOT = Path(__file__).resolve().parents[2]
DOC = (ROOT / "docs" / "learned_rewards.md").read_text()
BASE = ["model.path=tiny-random", "trainer.engine=local", "trainer.total_steps=2", "monitor.progress=false"]
RL = ["explorer.batch_size=2", "explorer.group_size=4", "buffer.eval_tasks.size=4"]
DIGIT = [
    "explorer.eval_reward_fn=format",
    "explorer.eval_reward_args={pattern: '.*[0-9].*'}",
]  # the random model never adds right


def blocks(lang: str) -> list[str]:
    return re.findall(rf"^```{lang}\n(.*?)^```", DOC, flags=re.DOTALL | re.MULTILINE)


def tiny(argv: list[str]) -> list[str]:
    """A documented command's arguments with the tiny-model overrides added."""
    cmd = argv[0]
    if cmd == "run":
        return argv + BASE + (RL if "grpo" in argv[2] else ["trainer.micro_batch_size=8"])
    if cmd == "rm-check":
        return argv + ["--model", "tiny-random", "--num-tasks", "4", "--samples", "4"]
    if cmd == "rm-pairs":  # overrides right after the recipe (positional arguments)
        return (
            argv[:2]
            + DIGIT
            + argv[2:]
            + ["--model", "tiny-random", "--num-tasks", "8", "--num-eval-tasks", "4", "--samples", "4"]
        )
    return argv


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    """A copy of examples/ where the page's commands run, one after the other, from the top."""
    root = tmp_path_factory.mktemp("learned_rewards")
    shutil.copytree(ROOT / "examples", root / "examples", ignore=shutil.ignore_patterns("client", "serve"))
    mp = pytest.MonkeyPatch()
    mp.chdir(root)
    try:
        for block in blocks("bash"):
            for line in block.strip().splitlines():
                argv = shlex.split(line)
                assert argv[0] == "trinity-like", line
                assert main(tiny(argv[1:])) == 0, line
        yield root
    finally:
        mp.undo()


def test_the_commands_run_as_written(workdir):
    for run in ("rm", "rm_policy"):
        report = json.loads((workdir / "runs" / run / "rm_check.json").read_text())
        assert report["samples"] == 16 and report["verifier"] == "exact_match"  # the recipe's eval_reward_fn
        assert all(p["n"] == 4 and p["rate"] is not None for p in report["probes"].values())
    summary = json.loads((workdir / "examples/data/pairs_policy/pairs.json").read_text())
    assert summary["tasks"]["pairs"] > 0 and summary["eval_tasks"]["pairs"] > 0
    rows = [json.loads(line) for line in (workdir / "runs/grpo_with_rm/metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "reward/gold_mean" in r] == [1, 2]  # exact match, beside the RM's reward
    assert [r["rm_check/samples"] for r in rows if "rm_check/samples" in r] == [4 * 4]  # the check at start
    assert (workdir / "runs/grpo_with_rm/metrics.png").exists()


@pytest.mark.parametrize("index", range(3))
def test_each_mitigation_runs_in_the_recipe(workdir, index, monkeypatch):
    snippet = yaml.safe_load(blocks("yaml")[index])
    overrides = [f"explorer.{k}={json.dumps(v)}" for k, v in snippet["explorer"].items()]
    monkeypatch.chdir(workdir)
    name = f"mitigation_{index}"
    assert main(["run", "--config", "examples/grpo_with_rm.yaml", f"name={name}", *overrides, *BASE, *RL]) == 0
    rows = [json.loads(line) for line in (workdir / "runs" / name / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "reward/mean" in r] == [1, 2]
