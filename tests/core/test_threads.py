"""Threads that share the machine: the cores given, the wait policy set before torch loads, said in the run log."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
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
    code = (
        "import os; from trinity_like import threads; threads.apply(look=lambda: 0.0); "
        "print(os.environ.get('GOMP_SPINCOUNT'), os.environ.get('OMP_WAIT_POLICY'))"
    )
    assert _in_child(code) == f"{threads.SPINCOUNT} None"
    busy = code.replace("lambda: 0.0", "lambda: 1.6")
    assert _in_child(busy) == "None PASSIVE"  # other work holds the cores: sleep at once
    env = {"OMP_WAIT_POLICY": "ACTIVE"}
    assert _in_child(code, env) == "None ACTIVE"  # the user's OMP_WAIT_POLICY stands alone
    assert _in_child(busy, {"GOMP_SPINCOUNT": "5"}) == "5 None"  # and so does their spin count
    line = _in_child(
        "from trinity_like import threads; threads.apply(look=lambda: 0.0); print(threads.describe(2, 2, 1))"
    )
    assert "quiet at start (0.0 cores used by others)" in line and "sleep after" in line
    assert "child processes only" not in line
    line = _in_child(
        "from trinity_like import threads; threads.apply(look=lambda: 1.6); print(threads.describe(2, 2, 1))"
    )
    assert "machine busy at start (1.6 cores used by others): OpenMP threads sleep at once" in line
    late = _in_child(
        "import torch; from trinity_like import threads; threads.apply(); print(threads.describe(2, 2, 1))"
    )
    assert "child processes only" in late  # said, not pretended: OpenMP read its settings already


def test_the_machines_load_is_measured_from_proc_against_a_real_competitor():
    """others_busy sees another process's work; choose() makes the run's threads sleep beside it."""
    if threads.others_busy(0.05) is None:
        pytest.skip("no /proc/stat here")
    spin = "import time\nend = time.time() + 3\nwhile time.time() < end: pass\n"
    competitor = subprocess.Popen([sys.executable, "-c", spin])
    try:
        time.sleep(0.3)
        beside = threads.others_busy(0.5)
    finally:
        competitor.kill()
        competitor.wait()
    # one spinning process holds up to a core (less when the machine is shared): busy enough
    assert beside is not None and beside >= threads.BUSY_CORES, beside
    assert threads.choose(beside) == {"OMP_WAIT_POLICY": "PASSIVE"}
    assert threads.choose(0.0) == {"GOMP_SPINCOUNT": str(threads.SPINCOUNT)}
    assert threads.choose(None) == {"GOMP_SPINCOUNT": str(threads.SPINCOUNT)}  # unknown: as quiet


def test_a_run_says_what_it_chose(tmp_path):
    cmd = [sys.executable, "-m", "trinity_like.cli", "run", "--config", str(REPO / "examples" / "grpo_arith.yaml")]
    cmd += [f"run_root={tmp_path}", "model.path=tiny-random", "trainer.engine=local", "trainer.total_steps=1"]
    cmd += ["explorer.batch_size=2", "explorer.group_size=4", "buffer.eval_tasks.size=4", "monitor.progress=false"]
    env = {k: v for k, v in os.environ.items() if k not in threads.OWN}
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    text = out.stdout + out.stderr + "".join(p.read_text() for p in (tmp_path / "grpo_arith").glob("*.log"))
    line = next(ln for ln in text.splitlines() if "threads: " in ln)
    # the run looked at the machine before torch loaded and said what it saw and chose
    assert f"{threads.cores_given()} cores given" in line, line
    assert re.search(r"(quiet|machine busy) at start \(\d+\.\d cores used by others\)", line), line


def test_the_benchmark_runs_in_its_tiny_mode(tmp_path):
    out = tmp_path / "threads"
    cmd = [sys.executable, str(REPO / "benchmarks" / "threads.py"), "--tiny", "--contenders", "ours", "--out", str(out)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(out.with_suffix(".json").read_text())
    assert set(result["median_step_s"]) == {"quiet/ours", "busy/ours"}
    assert all(v > 0 for v in result["median_step_s"].values())
