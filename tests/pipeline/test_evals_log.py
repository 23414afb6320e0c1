"""Every held-out evaluation leaves its items in ``evals.jsonl``: answers of RL runs, scored pairs of DPO/RM runs.

The items must add up to the evaluation's own mean in ``metrics.jsonl`` (computed on the
whole batch, by other code), step by step.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from _lib.tiny_runs import REPO, run

from trinity_like.config import load_plan
from trinity_like.monitor.evals import append_evals, read_jsonl
from trinity_like.runner import run_plan


def metrics_at(run_dir: Path, key: str) -> dict[int, float]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r[key] for r in rows if key in r}


def by_step(items: list[dict]) -> dict[int, list[dict]]:
    out: dict[int, list[dict]] = {}
    for it in items:
        out.setdefault(it["step"], []).append(it)
    return out


def test_rl_run_keeps_every_held_out_answer_of_every_evaluation(tmp_path):
    run_dir = run(
        tmp_path,
        "trainer.total_steps=2",
        "monitor.eval_interval=1",
        "explorer.eval_reward_fn=format",
        "explorer.eval_reward_args={pattern: '.*[0-9].*'}",
    )
    steps = by_step(read_jsonl(run_dir / "evals.jsonl"))
    accuracy = metrics_at(run_dir, "eval/accuracy")
    assert sorted(steps) == sorted(accuracy) == [0, 1, 2]
    for step, items in steps.items():
        assert len(items) == 8 and len({it["task_id"] for it in items}) == 8
        assert sum(it["reward"] for it in items) / 8 == pytest.approx(accuracy[step])
        assert all(
            it["kind"] == "answer"
            and it["prompt"].startswith("What is")
            and it["answer"].isdigit()
            and it["length"] > 0
            and it["finish_reason"] in ("stop", "length")
            for it in items
        )
    assert {it["task_id"] for it in steps[0]} == {it["task_id"] for it in steps[2]}  # the same problems each time


@pytest.mark.parametrize("recipe, margin", [("dpo.yaml", "reward_margin"), ("rm_tiny.yaml", "margin")])
def test_pair_runs_keep_each_held_out_pair_with_its_own_scores(recipe, margin, tmp_path):
    overrides = [
        f"run_root={tmp_path}",
        "model.path=tiny-random",
        "trainer.engine=local",
        "trainer.total_steps=2",
        "monitor.progress=false",
        "monitor.eval_interval=1",
        "buffer.train_batch_size=4",
        "trainer.optimizer.lr=1e-3",
    ]
    if recipe == "dpo.yaml":
        overrides += ["buffer.eval_tasks=null"]
    plan = load_plan(REPO / "examples" / recipe, overrides)
    assert run_plan(plan) == 0
    run_dir = Path(plan.stages[0].config.run_dir())
    steps = by_step(read_jsonl(run_dir / "evals.jsonl"))
    expected = metrics_at(run_dir, f"eval/{margin}")
    assert sorted(steps) == sorted(expected) and len(steps) >= 2
    for step, items in steps.items():
        assert all(it["kind"] == "pair" and it["chosen"] != it["rejected"] for it in items)
        mean = sum(it["metrics"][margin] for it in items) / len(items)
        assert mean == pytest.approx(expected[step], abs=1e-5)
    assert any(it["metrics"][margin] != 0 for it in steps[max(steps)])


def test_a_torn_last_line_is_skipped(tmp_path):
    path = tmp_path / "evals.jsonl"
    append_evals(path, 3, [{"kind": "answer", "task_id": "a"}, {"kind": "answer", "task_id": "b"}])
    with open(path, "a") as fh:
        fh.write('{"step": 4, "kind": "ans')
    assert [(r["step"], r["task_id"]) for r in read_jsonl(path)] == [(3, "a"), (3, "b")]
