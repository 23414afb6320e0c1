"""One GPU shared by the local train engine and an in-process explorer: memory changes hands around
every rollout, in this order -- the trainer's freed memory back to the device, the explorer's taken
again, the rollout, the explorer's cache and graphs freed, the trainer's taken again -- and on a CPU
nothing changes hands. The stage is a real one (tiny model, local engine); the GPU is declared."""

from __future__ import annotations

from pathlib import Path

import pytest
from _lib.tiny_runs import TINY

from trinity_like.config import load_plan
from trinity_like.pipeline.build import build_stage
from trinity_like.pipeline.stage import Stage

RECIPE = Path(__file__).resolve().parents[2] / "examples" / "grpo_arith.yaml"


@pytest.fixture
def stage(tmp_path):
    plan = load_plan(RECIPE, [f"run_root={tmp_path}", *TINY, "monitor.backends=[jsonl]"])
    built = build_stage(plan.stages[0], "both")
    yield built
    built.close()


def spy(calls: list[str], label: str, fn):
    def wrapped(*args, **kwargs):
        calls.append(label)
        return fn(*args, **kwargs)

    return wrapped


def record(stage: Stage, monkeypatch) -> list[str]:
    calls: list[str] = []
    actor, explorer = stage.trainer.actor, stage.explorer
    for who, obj in (("trainer", actor), ("explorer", explorer)):
        for verb in ("release_memory", "resume_memory"):
            monkeypatch.setattr(obj, verb, spy(calls, f"{who}.{verb}", getattr(obj, verb)))
    monkeypatch.setattr(explorer, "run", spy(calls, "explorer.run", explorer.run))
    return calls


def test_on_a_cpu_nothing_changes_hands(stage, monkeypatch):
    assert not stage._one_gpu()
    calls = record(stage, monkeypatch)
    rows, _ = stage.explore(1)
    assert rows and calls == ["explorer.run"]


def test_on_one_gpu_memory_changes_hands_around_each_rollout(stage, monkeypatch):
    monkeypatch.setattr(Stage, "_one_gpu", lambda self: True)
    calls = record(stage, monkeypatch)
    stage.explore(1)
    stage.evaluate(1)
    around = ["trainer.release_memory", "explorer.resume_memory", "explorer.run", "explorer.release_memory"]
    assert calls == [*around, "trainer.resume_memory", "trainer.release_memory", *around, "trainer.resume_memory"]
