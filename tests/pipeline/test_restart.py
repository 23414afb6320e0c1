"""The restart policy of :mod:`trinity_like.pipeline.restart`, in-process on the local engine.

A real run of the tiny recipe whose actor raises the error a dead verl worker raises
(:class:`~trinity_like.errors.WorkerDiedError`) at chosen forward/backward calls: the fault
is the only thing injected, the stage is built, closed, rebuilt and resumed for real. The
oracle is an uninterrupted run of the same recipe: its per-step rewards and the bytes of its
final weights. The real deaths (a SIGKILLed verl worker, explorer actor) are in
``tests/faults/test_verl_worker_kill.py`` and ``tests/faults/test_worker_restart.py``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from _lib.tiny_runs import RECIPE, TINY, final_weights, run

from trinity_like.config import load_plan
from trinity_like.errors import WorkerDiedError
from trinity_like.pipeline.restart import run_restartable
from trinity_like.pipeline.rl_loop import run_online
from trinity_like.pipeline.stage import Stage

STEPS = ["trainer.total_steps=3", "monitor.eval_at_start=false"]


def dying_loop(die_at: set[int], seen: list[Stage]):
    """run_online, whose actor's forward/backward calls numbered in ``die_at`` (counted over
    the whole run, restarts included) raise what a dead verl worker raises."""
    calls = {"n": 0}

    def loop(stage: Stage) -> dict[str, float]:
        seen.append(stage)
        real = stage.trainer.actor.forward_backward

        def forward_backward(*args, **kwargs):
            calls["n"] += 1
            if calls["n"] in die_at:
                raise WorkerDiedError(f"test worker (call {calls['n']}) died during forward/backward", "trainer")
            return real(*args, **kwargs)

        stage.trainer.actor.forward_backward = forward_backward
        return run_online(stage)

    return loop


def rewards(run_dir: Path) -> dict[int, float]:
    out = {}
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        row = json.loads(line)
        if "time/rollout" in row:
            out[row["step"]] = row["reward/mean"]
    return out


@pytest.fixture(scope="module")
def straight(tmp_path_factory) -> Path:
    return run(tmp_path_factory.mktemp("straight"), *STEPS)


@pytest.mark.parametrize(
    ("die_at", "step", "resumed", "more"),
    [
        ({2}, 2, "checkpoint step_000001", []),
        ({1}, 1, "the start (no checkpoint yet)", []),
        # a job told to start afresh still resumes from the checkpoint it saved itself
        ({2}, 2, "checkpoint step_000001", ["checkpoint.resume=false"]),
    ],
)
def test_a_death_rebuilds_the_stage_and_it_trains_what_an_uninterrupted_run_trains(
    die_at, step, resumed, more, tmp_path, straight, capsys
):
    plan = load_plan(RECIPE, [f"run_root={tmp_path}", *TINY, *STEPS, *more])
    seen: list[Stage] = []
    run_restartable(plan.stages[0], "both", dying_loop(die_at, seen))
    said = [line for line in capsys.readouterr().out.splitlines() if line.startswith("restart ")]
    assert said == [
        f"restart 1 of 2: test worker (call {step}) died during forward/backward, in step {step}; resuming from {resumed}"
    ]
    assert len(seen) == 2 and seen[0] is not seen[1] and seen[0].run is seen[1].run  # rebuilt, in the same directory
    run_dir = tmp_path / "grpo_arith"
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [(r["step"], r["fault/restarts"]) for r in rows if "fault/restarts" in r] == [(step, 1.0)]
    assert rewards(run_dir) == rewards(straight)
    assert final_weights(run_dir) == final_weights(straight)


def test_a_death_past_the_limit_ends_the_run_with_its_own_line(tmp_path, capsys):
    plan = load_plan(RECIPE, [f"run_root={tmp_path}", *TINY, *STEPS, "trainer.max_restarts=1"])
    with pytest.raises(WorkerDiedError) as err:
        run_restartable(plan.stages[0], "both", dying_loop({2, 3}, []))  # step 2, and step 2 again after the restart
    assert str(err.value) == (
        "test worker (call 3) died during forward/backward, after 1 restart(s) in this run "
        "(trainer.max_restarts=1): run the same command to resume from the latest checkpoint"
    )
    assert [line for line in capsys.readouterr().out.splitlines() if line.startswith("restart ")] == [
        "restart 1 of 1: test worker (call 2) died during forward/backward, in step 2; "
        "resuming from checkpoint step_000001"
    ]


def test_no_restart_allowed_raises_the_first_death_unchanged(tmp_path):
    plan = load_plan(RECIPE, [f"run_root={tmp_path}", *TINY, *STEPS, "trainer.max_restarts=0"])
    with pytest.raises(WorkerDiedError) as err:
        run_restartable(plan.stages[0], "both", dying_loop({2}, []))
    assert str(err.value) == (
        "test worker (call 2) died during forward/backward: run the same command to resume from the latest checkpoint"
    )
