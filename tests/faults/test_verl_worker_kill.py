"""SIGKILL of one verl FSDP worker mid-update: the driver stops within seconds, the same command resumes.

The default recipe on the tiny model with ``trainer.engine=verl`` and two FSDP workers
(gloo over loopback), 3 steps, a checkpoint every step. The kill point
``verl_worker_update`` (:mod:`trinity_like.fault_points`) SIGKILLs the last rank between
its forward and backward in step 2, so the other rank waits in FSDP's gradient collective
(gloo's timeout is 30 minutes). The test watches the run's worker processes to time how
long the driver takes from the death to its own exit, checks every worker is gone after
it, then resumes with the same command and counts buffer rows per step.

The per-step rewards are compared with an uninterrupted verl run of the same command.
Slow (three verl start-ups; the uninterrupted run goes on beside the killed one).
"""

from __future__ import annotations

import re
import subprocess
import time

import psutil
import pytest
from faultlib import (
    BATCH,
    FAULT_ENV,
    GROUP,
    STEPS,
    child_env,
    command,
    record,
    rows_by_step,
    run,
    start,
    step_metrics,
)

from trinity_like.pipeline.checkpoint import CheckpointManager

VERL = ["trainer.engine=verl", "cluster.trainer_workers=2"]


def verl_workers(driver: int) -> set[int]:
    """The verl worker processes a run started (Ray runs them under the driver's own raylet)."""
    found = set()
    try:
        children = psutil.Process(driver).children(recursive=True)
    except psutil.NoSuchProcess:
        return found
    for child in children:
        try:
            if "TrinityVerlWorker" in " ".join(child.cmdline()):
                found.add(child.pid)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass
    return found


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@pytest.mark.slow
def test_sigkill_of_a_verl_worker_mid_update_stops_the_run_at_once_and_it_resumes(tmp_path, record_property):
    # the uninterrupted run goes on beside the killed one (its own Ray, its own workers)
    log = open(tmp_path / "straight.log", "w")  # noqa: SIM115 -- a file, not a pipe nobody reads until the end
    straight = subprocess.Popen(
        command(tmp_path / "straight", *VERL, f"trainer.total_steps={STEPS}"),
        stdout=log,
        stderr=subprocess.STDOUT,
        env=child_env(),
    )
    cmd = command(tmp_path, *VERL, f"trainer.total_steps={STEPS}")
    run_dir = tmp_path / "grpo_arith"
    proc = start(cmd, **{FAULT_ENV: "verl_worker_update:2"})  # the last rank, in step 2's update
    seen: set[int] = set()
    died_at = None
    deadline = time.monotonic() + 540
    while proc.poll() is None:
        assert time.monotonic() < deadline, "the run neither finished nor stopped"
        seen |= verl_workers(proc.pid)
        if died_at is None and any(not alive(p) for p in seen):
            died_at = time.monotonic()
        time.sleep(0.05)
    exited_at = time.monotonic()
    _, err = proc.communicate()
    assert proc.returncode == 2, err[-3000:]
    line = err.strip().splitlines()[-1]  # Ray and verl log a few INFO lines before it
    assert re.fullmatch(
        r"trinity-like: error: verl worker rank 1 of 2 \(pid \d+\) died during forward/backward "
        r"\(.+\); the other workers were stopped: run the same command to resume from the latest "
        r"checkpoint",
        line,
    ), line
    assert died_at is not None, "no worker was seen to die"
    noticed_s = exited_at - died_at
    assert noticed_s < 30, f"the driver took {noticed_s:.1f} s to stop after the worker died"
    time.sleep(2)
    assert not [p for p in seen if alive(p)], "a verl worker outlived the run (stuck in a collective?)"
    mgr = CheckpointManager(run_dir)
    assert mgr.latest().name == "step_000001"
    mgr.verify(mgr.latest())

    t0 = time.monotonic()
    resumed = run(cmd, timeout=540)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "(step 1)" in resumed.stdout + resumed.stderr
    rows = rows_by_step(run_dir)
    assert {s: rows.get(s) for s in range(1, STEPS + 1)} == {s: BATCH * GROUP for s in range(1, STEPS + 1)}, rows
    assert rows.get("claimed", 0) == 0 and set(rows) - {"available"} == set(range(1, STEPS + 1)), rows
    assert straight.wait(timeout=540) == 0, (tmp_path / "straight.log").read_text()[-3000:]
    log.close()
    assert step_metrics(run_dir, "reward/mean") == step_metrics(tmp_path / "straight" / "grpo_arith", "reward/mean")
    record(
        record_property,
        "SIGKILL of one of 2 verl FSDP workers mid-update (step 2)",
        f"clean error naming the worker; driver exited {noticed_s:.1f} s after the death, no worker left",
        f"yes ({time.monotonic() - t0:.0f} s), same per-step rewards as an uninterrupted verl run",
        "0 lost, 0 twice",
    )
