"""SIGKILL of one verl FSDP worker mid-update: the run restarts its worker group and finishes by itself.

The default recipe on the tiny model with ``trainer.engine=verl`` and two FSDP workers
(gloo over loopback), 3 steps, a checkpoint every step. The kill point
``verl_worker_update`` (:mod:`trinity_like.fault_points`) SIGKILLs the last rank between
its forward and backward in step 2, so the other rank waits in FSDP's gradient collective
(gloo's timeout is 30 minutes); ``TRINITY_LIKE_FAULT_ONCE`` keeps the workers the run
starts in their place from dying too. The test watches the run's worker processes: the
driver notices the death within seconds, kills the stuck rank, starts a new group and
resumes from step 1's checkpoint (:mod:`trinity_like.pipeline.restart`), all in the one
process that was started once; no worker outlives the run.

Each step consumed its 8 buffer rows once, and the per-step rewards equal an uninterrupted
verl run's of the same command (run beside the killed one, its own Ray and workers).
Slow (three verl start-ups).
"""

from __future__ import annotations

import json
import re
import subprocess
import time

import psutil
import pytest
from _lib.faultlib import (
    BATCH,
    FAULT_ENV,
    GROUP,
    STEPS,
    child_env,
    command,
    record,
    restart_lines,
    rows_by_step,
    start,
    step_metrics,
)

from trinity_like.fault_points import ONCE_VAR
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
def test_sigkill_of_a_verl_worker_mid_update_is_restarted_in_the_run_exactly(tmp_path, record_property):
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
    fired = tmp_path / "fired"
    t0 = time.monotonic()
    proc = start(cmd, **{FAULT_ENV: "verl_worker_update:2", ONCE_VAR: str(fired)})  # the last rank, step 2
    first: set[int] = set()  # the first group's workers
    seen: set[int] = set()
    died_at = stuck_gone_at = restarted_at = None
    deadline = time.monotonic() + 540
    while proc.poll() is None:
        assert time.monotonic() < deadline, "the run did not finish"
        now = verl_workers(proc.pid)
        if died_at is None:
            first |= now
            if any(not alive(p) for p in first):
                died_at = time.monotonic()
        else:
            if stuck_gone_at is None and not any(alive(p) for p in first):
                stuck_gone_at = time.monotonic()
            if restarted_at is None and now - first:
                restarted_at = time.monotonic()
        seen |= now
        time.sleep(0.05)
    out, err = proc.communicate()
    took = time.monotonic() - t0
    assert proc.returncode == 0, err[-3000:]
    assert fired.exists() and died_at is not None, "no worker was seen to die"
    assert stuck_gone_at is not None and restarted_at is not None, (stuck_gone_at, restarted_at)
    noticed_s = stuck_gone_at - died_at
    assert noticed_s < 30, f"the surviving rank was stopped {noticed_s:.1f} s after the death (stuck in a collective?)"
    said = restart_lines(out + err)
    assert len(said) == 1 and re.fullmatch(
        r"restart 1 of 2: verl worker rank 1 of 2 \(pid \d+\) died during forward/backward \(.+\), in step 2; "
        r"resuming from checkpoint step_000001",
        said[0],
    ), said
    assert "(step 1)" in out + err  # the stage's own resume line
    time.sleep(2)
    assert not [p for p in seen if alive(p)], "a verl worker outlived the run"
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert {r["step"]: r["fault/restarts"] for r in metrics if "fault/restarts" in r} == {2: 1.0}
    mgr = CheckpointManager(run_dir)
    for path in mgr.list():
        mgr.verify(path)
    rows = rows_by_step(run_dir)
    assert {s: rows.get(s) for s in range(1, STEPS + 1)} == {s: BATCH * GROUP for s in range(1, STEPS + 1)}, rows
    assert rows.get("claimed", 0) == 0 and set(rows) - {"available"} == set(range(1, STEPS + 1)), rows
    assert straight.wait(timeout=540) == 0, (tmp_path / "straight.log").read_text()[-3000:]
    log.close()
    assert step_metrics(run_dir, "reward/mean") == step_metrics(tmp_path / "straight" / "grpo_arith", "reward/mean")
    record(
        record_property,
        "SIGKILL of one of 2 verl FSDP workers mid-update (step 2)",
        f"restarted in the run: the other rank gone {noticed_s:.1f} s after the death, a new group up "
        f"{restarted_at - died_at:.0f} s after it, resumed from step_000001 (restart 1 of 2, one log line, "
        "fault/restarts); no worker left",
        f"not needed: the run finished by itself ({took:.0f} s in all), same per-step rewards as an "
        "uninterrupted verl run",
        "0 lost, 0 twice",
    )
