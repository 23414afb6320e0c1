"""docs/async.md's commands run as written (the recipe shrunk to the tiny model by appended overrides)."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

from _lib.tiny_runs import TINY

from trinity_like.monitor.timeline import TIMELINE_FILE, read_spans

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "async.md"


def doc_commands() -> list[list[str]]:
    blocks = re.findall(r"^```bash\n(.*?)^```", DOC.read_text(), flags=re.DOTALL | re.MULTILINE)
    return [shlex.split(line) for b in blocks for line in b.splitlines() if line.strip()]


def call(argv: list[str], timeout: float = 600) -> subprocess.CompletedProcess:
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "HF_HUB_OFFLINE": "1"}
    return subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout, check=False)


def test_every_command_the_doc_shows_is_one_these_tests_run():
    """run and plot run below, benchmarks/async.py below, benchmarks/async_client.py in
    tests/cookbook/test_rl_stream_docs.py; a command of another kind would be run by none."""
    kinds = {("trinity-like", "run"), ("trinity-like", "plot"), ("python", "benchmarks/async.py")}
    kinds.add(("python", "benchmarks/async_client.py"))
    for argv in doc_commands():
        assert tuple(argv[:2]) in kinds, argv
        assert argv[0] != "python" or (ROOT / argv[1]).is_file(), argv


def test_the_run_and_plot_commands_run(tmp_path):
    runs, plot = [c for c in doc_commands() if c[1] == "run"], next(c for c in doc_commands() if c[1] == "plot")
    shrink = [*TINY, f"run_root={tmp_path}", "trainer.total_steps=3", "buffer.eval_tasks.size=4"]
    for argv in runs:
        done = call([sys.executable, "-m", "trinity_like.cli", *argv[1:], *shrink])
        assert done.returncode == 0, done.stderr[-3000:]
        offset = int(next(a for a in argv if a.startswith("synchronizer.offset=")).split("=")[1])
        rows = [json.loads(line) for line in (tmp_path / "grpo_arith" / "metrics.jsonl").read_text().splitlines()]
        assert max(r.get("staleness/max", 0) for r in rows) <= offset
        (tmp_path / "grpo_arith").rename(tmp_path / f"offset{offset}")
    (tmp_path / "offset1").rename(tmp_path / "grpo_arith")
    assert plot[-1] == "runs/grpo_arith"
    done = call([sys.executable, "-m", "trinity_like.cli", *plot[1:-1], str(tmp_path / "grpo_arith")])
    assert done.returncode == 0, done.stderr[-3000:]
    png = tmp_path / "grpo_arith" / "timeline.png"
    assert done.stdout.strip() == str(png) and png.stat().st_size > 10_000
    assert {s.actor for s in read_spans(tmp_path / "grpo_arith" / TIMELINE_FILE)} == {"explorer", "trainer"}


def test_plot_timeline_of_a_folder_without_one_is_one_line(tmp_path):
    done = call([sys.executable, "-m", "trinity_like.cli", "plot", "--timeline", str(tmp_path)])
    assert done.returncode == 2 and done.stderr.strip() == (
        f"trinity-like: error: {tmp_path}: no timeline.jsonl (is it a run directory of mode both, train or explore?)"
    )


def test_the_benchmark_check_runs(tmp_path):
    (argv,) = [c for c in doc_commands() if c[:2] == ["python", "benchmarks/async.py"]]
    assert argv == ["python", "benchmarks/async.py", "--tiny"]
    out = tmp_path / "async_tiny"
    done = call([sys.executable, *argv[1:], "--steps", "3", "--out", str(out)], timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads(out.with_suffix(".json").read_text())["results"]
    assert [r["variant"] for r in results] == ["sync", "off1", "off2"]
    assert results[0]["overlap_median"] == 0.0  # in turn: nothing hidden, by construction
    assert all(0.0 <= r["overlap_median"] <= 1.0 and r["steps_per_hour_median"] > 0 for r in results)
    assert all(len(run["rewards"]) == 3 for r in results for run in r["runs"])
    assert "| off2 |" in out.with_suffix(".md").read_text()
