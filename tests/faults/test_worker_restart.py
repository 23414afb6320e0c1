"""SIGKILL of the explorer actor: the run restarts it from its checkpoint and ends as if nothing died.

The fault tests' default recipe (local engine, 3 steps, a checkpoint every step) with the
explorer as a Ray actor (``explorer.placement=ray``). The kill point ``explorer_run``
(:mod:`trinity_like.fault_points`) SIGKILLs the actor as it starts its second batch, step
2's rollout; ``TRINITY_LIKE_FAULT_ONCE`` makes it fire in that actor only, not again in the
one the run starts in its place. The run must finish by itself (exit 0, started once), say
what died on one line, count the restart in ``metrics.jsonl``, and train exactly what an
uninterrupted run trains: each step's 8 buffer rows consumed once, the same per-step rewards.

Without ``TRINITY_LIKE_FAULT_ONCE`` every new actor dies at its second batch: with
``trainer.max_restarts=1`` the second death ends the run with the error's own line.
"""

from __future__ import annotations

import json
import re
import time

from _lib.faultlib import FAULT_ENV, check_resumed, command, record, restart_lines, run

from trinity_like.fault_points import ONCE_VAR

RAY_EXPLORER = ["explorer.placement=ray", "trainer.total_steps=3"]


def restarts_logged(run_dir) -> dict[int, float]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["fault/restarts"] for r in rows if "fault/restarts" in r}


def test_sigkill_of_the_explorer_actor_is_restarted_in_the_run_exactly(tmp_path, straight, record_property):
    cmd = command(tmp_path, *RAY_EXPLORER)
    t0 = time.monotonic()
    out = run(cmd, timeout=300, **{FAULT_ENV: "explorer_run:2", ONCE_VAR: str(tmp_path / "fired")})
    took = time.monotonic() - t0
    assert out.returncode == 0, out.stderr[-3000:]
    assert (tmp_path / "fired").exists(), "the fault never fired"
    said = restart_lines(out.stdout + out.stderr)
    assert len(said) == 1 and re.fullmatch(
        r"restart 1 of 2: the explorer actor \(pid \d+\) died during run \(.+\), in step 2; "
        r"resuming from checkpoint step_000001",
        said[0],
    ), said
    run_dir = tmp_path / "grpo_arith"
    assert restarts_logged(run_dir) == {2: 1.0}
    check_resumed(run_dir, straight)  # rows once each, every checkpoint verifies, same per-step rewards
    record(
        record_property,
        "SIGKILL of the explorer actor (explorer.placement: ray) as it starts step 2's rollout",
        "restarted in the run from checkpoint step_000001 (restart 1 of 2, one log line, fault/restarts)",
        f"not needed: the run finished by itself ({took:.0f} s in all), same per-step rewards as an uninterrupted run",
        "0 lost, 0 twice",
    )


def test_a_death_past_trainer_max_restarts_ends_the_run_with_one_line(tmp_path, record_property):
    cmd = command(tmp_path, *RAY_EXPLORER, "trainer.max_restarts=1")
    out = run(cmd, timeout=300, **{FAULT_ENV: "explorer_run:2"})  # every new actor dies at its 2nd batch too
    assert out.returncode == 2, out.stderr[-3000:]
    line = out.stderr.strip().splitlines()[-1]  # Ray logs an INFO line before it
    assert re.fullmatch(
        r"trinity-like: error: the explorer actor \(pid \d+\) died during run \(.+\), after 1 restart\(s\) in "
        r"this run \(trainer.max_restarts=1\): run the same command to resume from the latest checkpoint",
        line,
    ), line
    run_dir = tmp_path / "grpo_arith"
    assert restarts_logged(run_dir) == {2: 1.0}  # the first death restarted at step 2; the second, in step 3, not
    record(
        record_property,
        "the explorer actor dies again after each restart (trainer.max_restarts: 1)",
        "first death restarted; the second ends the run: one line naming the actor and the limit, exit 2",
        "-",
        "-",
    )
