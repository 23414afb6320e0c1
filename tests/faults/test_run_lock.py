"""Two runs on one run directory: the second refuses at once; a killed run's lock is not stuck."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from _lib.faultlib import BATCH, GROUP, command, kill, one_line_error, record, rows_by_step, run, start, wait_for

from trinity_like.pipeline.run_lock import RunInUseError, RunLock

TAKE = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from trinity_like.pipeline.run_lock import RunLock
    RunLock.acquire(Path(sys.argv[1]), sys.argv[2])
    print("locked", flush=True)
    time.sleep(float(sys.argv[3]))
""")


def take_in_child(run_dir: Path, role: str, hold_s: float) -> subprocess.Popen:
    child = subprocess.Popen(
        [sys.executable, "-c", TAKE, str(run_dir), role, str(hold_s)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert child.stdout.readline() == "locked\n", child.stderr.read()
    return child


def test_roles_exclude_what_they_share_and_a_killed_holder_frees_the_lock(tmp_path):
    run_dir = tmp_path / "run"
    RunLock.probe(run_dir, "both")  # no directory yet: free, and the probe creates nothing
    assert not run_dir.exists()
    holder = take_in_child(run_dir, "both", 60)
    for role in ("both", "train", "explore", "offline"):
        with pytest.raises(RunInUseError, match=rf"^{run_dir}: in use by another run \(pid {holder.pid} on "):
            RunLock.probe(run_dir, role)
    for role in ("both", "train", "explore", "offline"):
        with pytest.raises(
            RunInUseError,
            match=rf"^{run_dir}: in use by another run \(pid {holder.pid} on .+\); "
            r"two runs on one run directory would train steps twice",
        ):
            RunLock.acquire(run_dir, role)
    holder.kill()  # SIGKILL: nothing of the holder runs any more
    holder.communicate()
    RunLock.probe(run_dir, "both")
    lock = RunLock.acquire(run_dir, "both")  # at once: the kernel dropped the dead holder's lock
    lock.release()
    # Split modes: an explorer process and a trainer process share the directory.
    explorer = take_in_child(run_dir, "explore", 60)
    RunLock.probe(run_dir, "train")
    trainer = RunLock.acquire(run_dir, "train")
    with pytest.raises(RunInUseError):
        RunLock.acquire(run_dir, "explore")
    with pytest.raises(RunInUseError):
        RunLock.probe(run_dir, "explore")
    trainer.release()
    kill_and_wait(explorer)


PROBE = textwrap.dedent("""
    import sys
    from trinity_like.pipeline.run_lock import RunInUseError
    from trinity_like.runner import probe_recipe
    try:
        probe_recipe(sys.argv[1], sys.argv[2:])
    except RunInUseError as exc:
        print(exc)
    print(sorted(m for m in ("torch", "transformers", "datasets", "ray") if m in sys.modules))
""")


def test_the_recipes_run_directory_is_probed_before_plugins_and_models_load(tmp_path):
    """What ``trinity-like run`` can check first: the recipe's text names the run directory."""
    from _lib.faultlib import RECIPE

    holder = take_in_child(tmp_path / "grpo_arith", "both", 60)
    try:
        for mode, held in (("both", True), ("train", True), ("explore", True), ("bench", False)):
            out = subprocess.run(
                [sys.executable, "-c", PROBE, str(RECIPE), f"run_root={tmp_path}", f"mode={mode}"],
                capture_output=True,
                text=True,
                timeout=60,
                check=True,
            )
            lines = out.stdout.splitlines()
            assert lines[-1] == "[]", out.stdout  # nothing heavy imported to decide
            assert (
                len(lines) == 2
                and lines[0].startswith(f"{tmp_path / 'grpo_arith'}: in use by another run (pid {holder.pid} on ")
            ) == held, out.stdout
        out = subprocess.run(
            [sys.executable, "-c", PROBE, str(RECIPE), f"run_root={tmp_path}", "name=other"],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        assert out.stdout.splitlines() == ["[]"], out.stdout  # another run directory is free
        out = subprocess.run(
            [sys.executable, "-c", PROBE, str(RECIPE), "trainer.total_steps"],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        assert out.stdout.splitlines() == ["[]"], out.stdout  # a bad override is load_plan's to report
    finally:
        kill_and_wait(holder)


def kill_and_wait(child: subprocess.Popen) -> None:
    child.kill()
    child.communicate()


def test_a_second_run_refuses_then_the_killed_runs_directory_resumes(tmp_path, record_property):
    run_dir = tmp_path / "grpo_arith"
    first = start(command(tmp_path, "trainer.total_steps=100"))
    try:
        wait_for(lambda: (run_dir / "checkpoints" / "latest").exists(), 90, first)
        t0 = time.monotonic()
        second = run(command(tmp_path, "trainer.total_steps=100"))
        refused_s = time.monotonic() - t0
        line = one_line_error(second)
        assert line.startswith(f"trinity-like: error: {run_dir}: in use by another run (pid {first.pid} on "), line
        assert first.poll() is None, "the first run must go on"
    finally:
        kill(first)  # SIGKILL mid-run
    latest = int((run_dir / "checkpoints" / "latest").read_text().split("_")[1])
    t0 = time.monotonic()
    resumed = run(command(tmp_path, f"trainer.total_steps={latest + 1}"))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"(step {latest})" in resumed.stdout + resumed.stderr  # "resumed from ... (step N)"
    rows = rows_by_step(run_dir)
    assert {s: rows.get(s) for s in range(1, latest + 2)} == {s: BATCH * GROUP for s in range(1, latest + 2)}
    assert rows.get("claimed", 0) == 0
    record(
        record_property,
        "second run started on a live run's directory",
        f"clean error after {refused_s:.0f} s (first run goes on)",
        f"yes, after SIGKILL of the first ({time.monotonic() - t0:.0f} s)",
        "0 lost, 0 twice",
    )
