"""SIGKILL of the driver inside a checkpoint write, and a corrupted checkpoint, in real runs.

The run is the default recipe on the tiny model (local engine, explorer in the driver),
3 steps, a checkpoint every step. It is killed at each named point of
:mod:`trinity_like.fault_points` while saving step 2, then resumed with the same command.
After the resume: every checkpoint left verifies, each of the 3 steps consumed exactly
its 8 buffer rows (none lost, none twice, none left claimed), and the per-step mean
rewards equal those of an uninterrupted run -- the resumed run explored and trained
exactly what the uninterrupted one did.
"""

from __future__ import annotations

import shutil
import time

import pytest
from _lib.faultlib import FAULT_ENV, STEPS, check_resumed, command, one_line_error, record, run

from trinity_like.fault_points import CHECKPOINT_POINTS
from trinity_like.pipeline.checkpoint import CheckpointManager


@pytest.mark.parametrize("point", CHECKPOINT_POINTS)
def test_sigkill_inside_a_checkpoint_write_resumes_exactly(point, tmp_path, straight, record_property):
    cmd = command(tmp_path, f"trainer.total_steps={STEPS}")
    killed = run(cmd, **{FAULT_ENV: f"{point}:2"})  # while saving step 2
    assert killed.returncode == -9, killed.stderr[-3000:]
    run_dir = tmp_path / "grpo_arith"
    mgr = CheckpointManager(run_dir)
    latest = mgr.latest()
    mgr.verify(latest)  # what the next run will load is whole
    assert latest.name == ("step_000002" if point == "after_latest" else "step_000001")
    t0 = time.monotonic()
    resumed = run(cmd)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    check_resumed(run_dir, straight)
    record(
        record_property,
        f"SIGKILL of the driver during checkpoint write ({point.replace('_', ' ')})",
        "killed; previous checkpoint verifies",
        f"yes ({time.monotonic() - t0:.0f} s), same per-step rewards",
        "0 lost, 0 twice",
    )


def test_a_truncated_checkpoint_is_a_clear_error_and_the_previous_one_resumes(tmp_path, straight, record_property):
    cmd = command(tmp_path, f"trainer.total_steps={STEPS}")
    first = run(command(tmp_path, "trainer.total_steps=2"))
    assert first.returncode == 0, first.stderr[-3000:]
    run_dir = tmp_path / "grpo_arith"
    bad = run_dir / "checkpoints" / "step_000002"
    weights = bad / "model" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])  # a copy cut short
    before = sorted(str(p.relative_to(run_dir)) for p in run_dir.rglob("*") if "tensorboard" not in p.parts)
    line = one_line_error(run(cmd))
    moved = bad.parent / "corrupt-step_000002"
    assert line == (
        f"trinity-like: error: checkpoint {bad}: model/model.safetensors is {weights.stat().st_size} bytes, "
        f"{2 * weights.stat().st_size} when saved (truncated?); to resume from the checkpoint before it "
        f"(step_000001), move this one aside (mv {bad} {moved}) and run the same command"
    )
    after = sorted(str(p.relative_to(run_dir)) for p in run_dir.rglob("*") if "tensorboard" not in p.parts)
    assert after == before, "the refused resume wrote into the run directory"
    shutil.move(bad, moved)  # what the message says to do
    t0 = time.monotonic()
    resumed = run(cmd)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "(step 1)" in resumed.stdout + resumed.stderr
    check_resumed(run_dir, straight)
    record(
        record_property,
        "truncated weights file in the latest checkpoint",
        "clean error naming the file and the way back",
        f"yes, from the previous checkpoint ({time.monotonic() - t0:.0f} s)",
        "0 lost, 0 twice",
    )
