"""docs/async.md's client section as written: its Python snippet (the built-in SmolLM2), its benchmark
command (the tiny model; results sent to a temporary folder) and its recipe fragment."""

from __future__ import annotations

import ast
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import yaml

from trinity_like.config import load_plan

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "async.md"


def blocks(lang: str) -> list[str]:
    return re.findall(rf"^```{lang}\n(.*?)^```", DOC.read_text(), flags=re.DOTALL | re.MULTILINE)


def run(argv: list[str], cwd: Path) -> str:
    done = subprocess.run(
        argv,
        check=False,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    return done.stdout


def test_the_snippet_runs_one_iteration_off_policy(tmp_path):
    (code,) = [b for b in blocks("python") if "max_steps_off_policy" in b]
    out = run([sys.executable, "-c", code], tmp_path)
    assert ast.literal_eval(out.strip().splitlines()[-1]) == [0.0, 1.0, 1.0]  # as the comment in the doc says
    rows = [json.loads(line) for line in (tmp_path / "runs" / "k1" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3] and rows[1]["async/staleness_mean"] == 1.0


def test_the_benchmark_command_runs(tmp_path):
    (command,) = [b.strip() for b in blocks("bash") if "benchmarks/async_client.py" in b]
    argv = shlex.split(command)
    assert argv[0] == "python"
    run([sys.executable, *argv[1:], "--out", str(tmp_path / "bench")], ROOT)  # results away from the checkout
    results = json.loads((tmp_path / "bench.json").read_text())["results"]
    assert [r["variant"] for r in results] == ["sync", "k1", "k2"]
    assert results[0]["overlap_median"] == 0 and all(0 <= r["overlap_median"] <= 1 for r in results)
    assert all(len(run["rewards"]) == 2 for r in results for run in r["runs"])
    assert "| k1 |" in (tmp_path / "bench.md").read_text()


def test_the_recipe_fragment_resolves(tmp_path):
    (fragment,) = [b for b in blocks("yaml") if "ppo_tis" in b]
    recipe = {
        **yaml.safe_load(fragment),
        "name": "tis",
        "buffer": {"tasks": {"generator": "arithmetic"}},
        "trainer": {"engine": "local"},
    }
    (tmp_path / "r.yaml").write_text(yaml.safe_dump(recipe))
    (stage,) = load_plan(tmp_path / "r.yaml").stages
    assert stage.components["policy_loss"].name == "ppo_tis" and stage.components["policy_loss"].params.tis_cap == 2.0
