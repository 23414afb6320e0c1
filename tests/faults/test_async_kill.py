"""SIGKILL of a run whose explorer explores while the trainer trains (``synchronizer.offset: 1``).

The run is the fault tests' default recipe on the tiny model (explorer thread in the
driver) with ``synchronizer.offset=1``: batch t+1 is explored while step t trains, and a
checkpoint first puts every batch the explorer drew into the buffer. It is killed twice:
inside the checkpoint write of step 2, and at a moment when the explorer thread is busy
(step 2 logged, step 3 training). The same command resumes it. The oracle is the buffer
(each step consumed exactly its 8 rows: none lost, none twice, none left claimed) and an
uninterrupted run with the same offset (per-step rewards: the resumed run trained what it did).

With the explorer as a Ray actor (``explorer.placement=ray``), the actor is killed as it
starts step 2's batch, which it explores while step 1 trains: the run restarts it from the
latest checkpoint by itself (:mod:`trinity_like.pipeline.restart`) and ends with the same
rows and per-step rewards, started once.
"""

from __future__ import annotations

import json
import time

import pytest
from _lib.faultlib import (
    FAULT_ENV,
    STEPS,
    check_resumed,
    command,
    kill,
    record,
    restart_lines,
    rows_by_step,
    run,
    start,
    trained_steps,
    wait_for,
)

from trinity_like.fault_points import ONCE_VAR
from trinity_like.pipeline.checkpoint import CheckpointManager

ASYNC = "synchronizer.offset=1"
MORE = STEPS + 2  # the mid-step kill needs steps after the one it lands in


@pytest.fixture(scope="module")
def straight_async(tmp_path_factory):
    """Uninterrupted offset-1 runs of STEPS and MORE steps."""
    out = {}
    for steps in (STEPS, MORE):
        root = tmp_path_factory.mktemp(f"straight_async_{steps}")
        done = run(command(root, f"trainer.total_steps={steps}", ASYNC))
        assert done.returncode == 0, done.stderr[-3000:]
        out[steps] = root / "grpo_arith"
    return out


def test_sigkill_inside_a_checkpoint_write_with_the_explorer_running_ahead(tmp_path, straight_async, record_property):
    cmd = command(tmp_path, f"trainer.total_steps={STEPS}", ASYNC)
    killed = run(cmd, **{FAULT_ENV: "after_weights:2"})
    assert killed.returncode == -9, killed.stderr[-3000:]
    run_dir = tmp_path / "grpo_arith"
    assert CheckpointManager(run_dir).latest().name == "step_000001"
    t0 = time.monotonic()
    resumed = run(cmd)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    check_resumed(run_dir, straight_async[STEPS])
    record(
        record_property,
        "SIGKILL inside a checkpoint write, explorer running ahead (offset 1)",
        "killed; previous checkpoint verifies",
        f"yes ({time.monotonic() - t0:.0f} s), same per-step rewards",
        "0 lost, 0 twice",
    )


def _logged_steps(run_dir) -> set[int]:
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return set()
    return {json.loads(line)["step"] for line in path.read_text().splitlines() if '"loss"' in line}


def test_sigkill_while_the_explorer_thread_explores(tmp_path, straight_async, record_property):
    cmd = command(tmp_path, f"trainer.total_steps={MORE}", ASYNC)
    run_dir = tmp_path / "grpo_arith"
    proc = start(cmd)
    try:
        wait_for(lambda: 2 in _logged_steps(run_dir), timeout=120, proc=proc)
    finally:
        kill(proc)
    assert proc.returncode == -9
    t0 = time.monotonic()
    resumed = run(cmd)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    # Rows exactly once, and rewards: batches put into the buffer after the last checkpoint are
    # explored again by the resumed explorer under the same row ids, which the buffer drops, so
    # every step trains what an uninterrupted run trains and nothing is left over.
    check_resumed(run_dir, straight_async[MORE], MORE)
    assert rows_by_step(run_dir).get("available", 0) == 0
    assert trained_steps(run_dir)[-1] == MORE
    record(
        record_property,
        "SIGKILL mid-run while the explorer explores ahead (offset 1)",
        "killed",
        f"yes ({time.monotonic() - t0:.0f} s), same per-step rewards",
        "0 lost, 0 twice",
    )


def test_sigkill_of_the_explorer_actor_while_it_explores_ahead_is_restarted_in_the_run(
    tmp_path, straight_async, record_property
):
    # the explorer as a Ray actor, driven by the explorer thread; killed as it starts step 2's
    # batch, which it explores while step 1 trains (once: the new actor does not die again)
    cmd = command(tmp_path, f"trainer.total_steps={STEPS}", ASYNC, "explorer.placement=ray")
    t0 = time.monotonic()
    out = run(cmd, timeout=300, **{FAULT_ENV: "explorer_run:2", ONCE_VAR: str(tmp_path / "fired")})
    assert out.returncode == 0, out.stderr[-3000:]
    said = restart_lines(out.stdout + out.stderr)
    assert len(said) == 1 and said[0].startswith("restart 1 of 2: the explorer actor (pid "), said
    assert ", in step 2; resuming from " in said[0], said
    check_resumed(tmp_path / "grpo_arith", straight_async[STEPS])
    record(
        record_property,
        "SIGKILL of the explorer actor while it explores ahead (offset 1, explorer.placement: ray)",
        f"restarted in the run (restart 1 of 2), resuming from {said[0].rsplit('resuming from ', 1)[1]}",
        f"not needed: the run finished by itself ({time.monotonic() - t0:.0f} s in all), same per-step rewards",
        "0 lost, 0 twice",
    )
