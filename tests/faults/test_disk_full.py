"""A full disk while a real run writes a checkpoint or the buffer: one line, nothing half-written, resumed.

The run is the default recipe on the tiny model, 3 steps, a checkpoint every step. The
write fault points of :mod:`trinity_like.fault_points` make the OS call fail as a full
disk does (``OSError(ENOSPC)``) at step 2's checkpoint or step 3's buffer write; then the
same command runs again (as after freeing space). SQLite's own "database or disk is full"
is produced for real below with its page limit, through the same handling.
"""

from __future__ import annotations

import re
import sqlite3
import time

import pytest
from _lib.faultlib import (
    FAULT_ENV,
    STEPS,
    check_resumed,
    command,
    one_line_error,
    record,
    run,
)

from trinity_like.buffer.sqlite_storage import SqliteParams, SqliteStorage
from trinity_like.experience import Experience
from trinity_like.pipeline.checkpoint import CheckpointManager
from trinity_like.pipeline.disk_full import DiskFullError, disk_full_as_error

CASES = {  # fault -> (what the message says could not be written, checkpoint left as latest)
    "checkpoint_write:2": (
        (
            r"checkpoint step_000002 in {ckpts} \({ckpts}/\.tmp-step_000002-\d+/model: No space left on "
            r"device\); nothing of it was kept and the previous checkpoint step_000001 is intact"
        ),
        1,
    ),
    "buffer_write:3": (
        (
            r"step 3's rollouts into the buffer \({run_dir}/buffer\.sqlite\) \({run_dir}/buffer\.sqlite: No "
            r"space left on device\); the buffer keeps every earlier row and checkpoint step_000002 is intact"
        ),
        2,
    ),
}


@pytest.mark.parametrize("fault", CASES)
def test_disk_full_is_one_line_keeps_the_previous_checkpoint_and_resumes(fault, tmp_path, straight, record_property):
    cmd = command(tmp_path, f"trainer.total_steps={STEPS}")
    run_dir = tmp_path / "grpo_arith"
    what, left = CASES[fault]
    line = one_line_error(run(cmd, **{FAULT_ENV: fault}))
    pattern = what.format(ckpts=re.escape(str(run_dir / "checkpoints")), run_dir=re.escape(str(run_dir)))
    assert re.fullmatch(
        rf"trinity-like: error: disk full: could not write {pattern}: free space and run the same "
        r"command to resume",
        line,
    ), line
    ckpts = run_dir / "checkpoints"
    assert not [p.name for p in ckpts.iterdir() if p.name.startswith(".")], "a partial checkpoint was left behind"
    mgr = CheckpointManager(run_dir)
    assert mgr.latest().name == f"step_{left:06d}"
    mgr.verify(mgr.latest())
    t0 = time.monotonic()
    resumed = run(cmd)  # space freed: the same command
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"(step {left})" in resumed.stdout + resumed.stderr
    check_resumed(run_dir, straight)
    where = "a checkpoint (step 2)" if fault.startswith("checkpoint") else "the buffer (step 3's rollouts)"
    record(
        record_property,
        f"disk full (ENOSPC) while writing {where}",
        f"clean error naming the file; step_{left:06d} verifies, no partial folder",
        f"yes ({time.monotonic() - t0:.0f} s), same per-step rewards",
        "0 lost, 0 twice",
    )


def test_sqlites_own_disk_full_is_the_same_one_line(tmp_path):
    """A real SQLITE_FULL (the database may not grow past its page limit), not an injected one."""
    storage = SqliteStorage(params=SqliteParams(), run_dir=tmp_path)
    try:
        storage.put([Experience(tokens=[1, 2, 3], prompt_length=1, eid="e0")])
        pages = storage._db.execute("PRAGMA page_count").fetchone()[0]
        storage._db.execute(f"PRAGMA max_page_count={pages}")  # full: no page more
        big = [Experience(tokens=list(range(5000)), prompt_length=1, eid=f"big{i}") for i in range(4)]
        with (
            pytest.raises(
                DiskFullError,
                match=r"^disk full: could not write rollouts \(database or disk is full\); "
                r"the buffer is intact: free space and run the same command to resume$",
            ),
            disk_full_as_error("rollouts", "the buffer is intact"),
        ):
            storage.put(big)
        assert storage.count() == 1  # the transaction was rolled back whole
    finally:
        storage.close()


def test_other_write_errors_pass_through_unchanged(tmp_path):
    with pytest.raises(PermissionError), disk_full_as_error("x", "y"):
        raise PermissionError(13, "Permission denied", str(tmp_path))
    with pytest.raises(sqlite3.OperationalError, match="no such table"), disk_full_as_error("x", "y"):
        sqlite3.connect(":memory:").execute("SELECT * FROM missing_table")
    full = pytest.raises(DiskFullError, match=r"could not write x \(f: No space left on device\); y")
    with full, disk_full_as_error("x", "y"):
        try:
            raise OSError(28, "No space left on device", "f")
        except OSError as exc:
            raise OSError("a writer's own words") from exc  # the ENOSPC is found in the chain
