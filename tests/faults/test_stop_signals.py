"""A run stops when asked: SIGTERM and SIGINT end it within seconds with one line saying what
was kept and how to resume; a second signal stops at once; nothing it started stays running.

The default recipe on the tiny model, as a child process a user (or a scheduler) signals
once its first checkpoint is written. Each test lists every process the run started just
before the signal (Ray's own processes and its workers for the verl engine) and checks that
none outlives the run, then resumes with the same command to show the line told the truth.
"""

from __future__ import annotations

import contextlib
import signal
import time
from pathlib import Path

import psutil
import pytest
from _lib.faultlib import command, record, run, start, wait_for

from trinity_like.pipeline.checkpoint import CheckpointManager

LONG = "trainer.total_steps=60"  # still running when the signal comes


def descendants(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def survivors(procs: list[psutil.Process]) -> list[str]:
    out = []
    for p in procs:
        try:
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                out.append(f"{p.pid} {' '.join(p.cmdline())[:120]}")
        except psutil.NoSuchProcess:
            pass
    return out


def signal_after_checkpoint(tmp_path: Path, signals: list[int], *overrides: str, timeout: float = 120):
    """Start a long run, wait for its first checkpoint, send ``signals`` (0.2 s apart);
    returns (completed stderr, return code, seconds from the first signal to the exit,
    processes it had started, their command lines)."""
    proc = start(command(tmp_path, LONG, *overrides))
    run_dir = tmp_path / "grpo_arith"
    try:
        wait_for(lambda: CheckpointManager(run_dir).latest() is not None, timeout, proc)
        started = descendants(proc.pid)
        names = []
        for p in started:
            with contextlib.suppress(psutil.Error):
                names.append(" ".join(p.cmdline()))
        t0 = time.monotonic()
        for i, sig in enumerate(signals):
            if i:
                time.sleep(0.2)
            proc.send_signal(sig)
        _, err = proc.communicate(timeout=60)
        took = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    time.sleep(0.5)  # a child killed with its parent is reaped by init a moment later
    return err, proc.returncode, took, started, names


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_ends_the_run_with_one_line_saying_what_was_kept(tmp_path, sig, record_property):
    err, code, took, started, _ = signal_after_checkpoint(tmp_path, [sig])
    name = signal.Signals(sig).name
    lines = [line for line in err.splitlines() if line.startswith("trinity-like:")]
    assert code == 128 + sig, err[-3000:]
    assert len(lines) == 1 and lines[0].startswith(f"trinity-like: stopped by {name}; kept "), err[-3000:]
    run_dir = tmp_path / "grpo_arith"
    latest = CheckpointManager(run_dir).latest()
    assert f"checkpoint {latest.name} " in lines[0] and "the same command resumes from it" in lines[0], lines[0]
    assert "rows in the buffer" in lines[0], lines[0]
    assert took < 15, f"{took:.1f} s from {name} to the exit"
    assert not survivors(started), survivors(started)
    # what the line promised: the same command goes on from that checkpoint
    again = run(command(tmp_path, f"trainer.total_steps={int(latest.name.split('_')[1]) + 1}"))
    assert again.returncode == 0, again.stderr[-3000:]
    assert "resum" in (again.stdout + again.stderr).lower(), again.stdout[-2000:]
    record(
        record_property,
        f"{name} to a local-engine run after its first checkpoint",
        f"ends in {took:.1f} s, exit {128 + sig}, one line naming the checkpoint and buffer rows; no process left",
        "yes, by the same command",
        "none lost (rows stay in the buffer)",
    )


def test_a_second_signal_stops_at_once(tmp_path, record_property):
    err, code, took, started, _ = signal_after_checkpoint(tmp_path, [signal.SIGTERM, signal.SIGTERM])
    assert code == 128 + signal.SIGTERM, err[-3000:]
    assert "again: stopping now" in err or "stopped by SIGTERM" in err, err[-3000:]
    assert took < 5, f"{took:.1f} s"
    assert not survivors(started), survivors(started)
    record(
        record_property,
        "SIGTERM twice, 0.2 s apart",
        f"ends in {took:.1f} s, exit 143; no process left",
        "yes, from the last checkpoint",
        "none lost",
    )


@pytest.mark.slow
def test_sigterm_ends_a_verl_run_and_every_ray_process(tmp_path, record_property):
    err, code, took, started, names = signal_after_checkpoint(
        tmp_path, [signal.SIGTERM], "trainer.engine=verl", "cluster.trainer_workers=1", timeout=300
    )
    lines = [line for line in err.splitlines() if line.startswith("trinity-like:")]
    assert code == 143, err[-3000:]
    assert (
        len(lines) == 1
        and lines[0].startswith("trinity-like: stopped by SIGTERM; kept ")
        and " checkpoint step_" in lines[0]
    ), err[-3000:]
    assert any("raylet" in name for name in names), names  # Ray ran under this run, and is gone below
    assert not survivors(started), survivors(started)
    assert took < 30, f"{took:.1f} s"
    record(
        record_property,
        "SIGTERM to a verl-engine run (workers and explorer through Ray)",
        f"ends in {took:.1f} s, exit 143, one line; Ray and every worker gone",
        "yes, by the same command",
        "none lost",
    )
