"""SIGKILL of the explorer process or of the trainer process of the split modes, each resumed.

``mode=train`` and ``mode=explore`` run as two processes on one run directory (buffer,
weight channel). One of them is SIGKILLed mid-run (the explorer once it has written step
2's rollouts, the trainer once it has checkpointed step 1) and started again with the
same command while the other keeps running. Both then finish; each step's 8 buffer rows
were trained exactly once and the trainer's per-step rewards equal an uninterrupted
``mode=both`` run's (on-policy: the batch of step t is sampled by the weights of step t - 1
in either layout).

An explorer process whose explorer is a Ray actor (``explorer.placement=ray``) restarts that
actor itself when it dies, from ``explorer/state.json`` (:mod:`trinity_like.pipeline.restart`):
both processes finish without being started again, with the same rows and rewards.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest
from _lib.faultlib import (
    BATCH,
    FAULT_ENV,
    GROUP,
    STEPS,
    command,
    kill,
    record,
    restart_lines,
    rows_by_step,
    start,
    step_metrics,
    wait_for,
)

from trinity_like.fault_points import ONCE_VAR


def trainer_rewards(run_dir: Path) -> dict[int, float]:
    """``reward/mean`` of each step the trainer process trained (a redone step's last line wins)."""
    out = {}
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        row = json.loads(line)
        if "time/update" in row:
            out[int(row["step"])] = row["reward/mean"]
    return out


def explorer_step(run_dir: Path) -> int:
    state = run_dir / "explorer" / "state.json"
    try:
        return int(json.loads(state.read_text())["step"])
    except (OSError, ValueError, KeyError):
        return 0


READY = {  # victim -> when it is killed
    "explorer": lambda run_dir: explorer_step(run_dir) >= 2,
    "trainer": lambda run_dir: (run_dir / "checkpoints" / "latest").exists(),
}


@pytest.mark.parametrize("victim", list(READY))
def test_sigkill_of_a_split_mode_process_resumes_with_each_batch_trained_once(
    victim, tmp_path, straight, record_property
):
    cmds = {
        role: command(tmp_path, f"trainer.total_steps={STEPS}", f"mode={mode}")
        for role, mode in (("trainer", "train"), ("explorer", "explore"))
    }
    run_dir = tmp_path / "grpo_arith"
    procs = {role: start(cmd) for role, cmd in cmds.items()}
    try:
        wait_for(lambda: READY[victim](run_dir), 240, procs[victim])
        kill(procs[victim])  # SIGKILL
        t0 = time.monotonic()
        procs[victim] = start(cmds[victim])  # the same command, the other process still running
        outputs = {}
        for role, proc in procs.items():
            out, err = proc.communicate(timeout=300)
            assert proc.returncode == 0, f"{role}: {err[-3000:]}"
            outputs[role] = out + err
        resumed_s = time.monotonic() - t0
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                kill(proc)
    said = "explorer resumed after step" if victim == "explorer" else "resumed from"
    assert said in outputs[victim], outputs[victim][-3000:]
    rows = rows_by_step(run_dir)
    assert {s: rows.get(s) for s in range(1, STEPS + 1)} == {s: BATCH * GROUP for s in range(1, STEPS + 1)}, rows
    assert rows.get("claimed", 0) == 0 and set(rows) - {"available"} == set(range(1, STEPS + 1)), rows
    assert trainer_rewards(run_dir) == step_metrics(straight, "reward/mean")
    record(
        record_property,
        f"SIGKILL of the {victim} process (split modes: mode=train + mode=explore)",
        "killed; the other process waits",
        f"yes, restarted beside the other ({resumed_s:.0f} s to the end), same per-step rewards as mode=both",
        "0 lost, 0 twice",
    )


def test_sigkill_of_the_explorer_processs_actor_is_restarted_by_that_process(tmp_path, straight, record_property):
    # mode=explore with its explorer as a Ray actor: the actor is killed as it starts step 2's
    # rollout; the explorer process restarts it from explorer/state.json by itself
    run_dir = tmp_path / "grpo_arith"
    fault = {FAULT_ENV: "explorer_run:2", ONCE_VAR: str(tmp_path / "fired")}
    procs = {
        "trainer": start(command(tmp_path, f"trainer.total_steps={STEPS}", "mode=train")),
        "explorer": start(
            command(tmp_path, f"trainer.total_steps={STEPS}", "mode=explore", "explorer.placement=ray"), **fault
        ),
    }
    t0 = time.monotonic()
    try:
        outputs = {}
        for role, proc in procs.items():
            out, err = proc.communicate(timeout=300)
            assert proc.returncode == 0, f"{role}: {err[-3000:]}"
            outputs[role] = out + err
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                kill(proc)
    said = restart_lines(outputs["explorer"])
    assert len(said) == 1 and re.fullmatch(
        r"restart 1 of 2: the explorer actor \(pid \d+\) died during run \(.+\), in step 2; "
        r"resuming from explorer/state.json \(after step 1\)",
        said[0],
    ), said
    rows = rows_by_step(run_dir)
    assert {s: rows.get(s) for s in range(1, STEPS + 1)} == {s: BATCH * GROUP for s in range(1, STEPS + 1)}, rows
    assert rows.get("claimed", 0) == 0 and set(rows) - {"available"} == set(range(1, STEPS + 1)), rows
    assert trainer_rewards(run_dir) == step_metrics(straight, "reward/mean")
    record(
        record_property,
        "SIGKILL of the explorer actor of an explorer process (mode=explore, explorer.placement: ray)",
        "restarted by the explorer process from explorer/state.json (restart 1 of 2, one log line); the trainer waits",
        f"not needed: both processes finished by themselves ({time.monotonic() - t0:.0f} s), same per-step "
        "rewards as mode=both",
        "0 lost, 0 twice",
    )
