"""Threads that share the machine: the cores given, the wait policy set before torch loads, said in the run log."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from trinity_like import threads

REPO = Path(__file__).resolve().parents[2]


def _in_child(code: str, env: dict[str, str] | None = None, prefix: list[str] | None = None) -> str:
    full = {k: v for k, v in os.environ.items() if k not in threads.OWN}
    full.update(env or {})
    out = subprocess.run(
        [*(prefix or []), sys.executable, "-c", code], env=full, capture_output=True, text=True, check=True
    )
    return out.stdout.strip()


@pytest.mark.skipif(not hasattr(os, "sched_getaffinity") or len(os.sched_getaffinity(0)) < 2, reason="needs 2 cores")
def test_cores_given_follow_the_affinity_mask_not_the_machine():
    one = next(iter(os.sched_getaffinity(0)))
    got = _in_child(
        "from trinity_like.threads import cores_given; print(cores_given())", prefix=["taskset", "-c", str(one)]
    )
    assert got == "1"
    assert threads.cores_given() == len(os.sched_getaffinity(0))


def test_the_wait_policy_is_set_before_torch_and_a_users_choice_is_kept():
    code = "import os; from trinity_like import threads; threads.apply(); print(os.environ.get('GOMP_SPINCOUNT'))"
    assert _in_child(code) == str(threads.SPINCOUNT)
    env = {"OMP_WAIT_POLICY": "ACTIVE"}
    assert _in_child(code, env) == "None"  # the user's OMP_WAIT_POLICY stands alone
    line = _in_child("from trinity_like import threads; threads.apply(); print(threads.describe(2, 2, 1))")
    assert "sleep after" in line and "child processes only" not in line
    late = _in_child(
        "import torch; from trinity_like import threads; threads.apply(); print(threads.describe(2, 2, 1))"
    )
    assert "child processes only" in late  # said, not pretended: OpenMP read its settings already


def test_a_run_says_what_it_chose(tmp_path):
    cmd = [sys.executable, "-m", "trinity_like.cli", "run", "--config", str(REPO / "examples" / "grpo_arith.yaml")]
    cmd += [f"run_root={tmp_path}", "model.path=tiny-random", "trainer.engine=local", "trainer.total_steps=1"]
    cmd += ["explorer.batch_size=2", "explorer.group_size=4", "buffer.eval_tasks.size=4", "monitor.progress=false"]
    env = {k: v for k, v in os.environ.items() if k not in threads.OWN}
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    text = out.stdout + out.stderr + "".join(p.read_text() for p in (tmp_path / "grpo_arith").glob("*.log"))
    line = next(ln for ln in text.splitlines() if "threads: " in ln)
    assert f"{threads.cores_given()} cores given" in line and f"sleep after {threads.SPINCOUNT:,} spins" in line


def test_the_benchmark_runs_in_its_tiny_mode(tmp_path):
    out = tmp_path / "threads"
    cmd = [sys.executable, str(REPO / "benchmarks" / "threads.py"), "--tiny", "--contenders", "ours", "--out", str(out)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(out.with_suffix(".json").read_text())
    assert set(result["median_step_s"]) == {"quiet/ours", "busy/ours"}
    assert all(v > 0 for v in result["median_step_s"].values())
