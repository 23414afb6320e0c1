"""MIX end to end on the tiny model: every sampled row is trained exactly once, in the step that made it.

``examples/mix.yaml`` shrunk to the tiny model and the local engine, synchronous (the
explorer writes a step's rows with the weights the trainer then updates), 10 steps. The
mix strategy adds its expert rows on top of the rollouts (``algorithms.sampling``), so
nothing the explorer wrote is left in the FIFO buffer: staleness is 0 at every step and
the SQLite buffer ends with every row consumed, by the step after the version that
sampled it (rows sampled by version v train the step v + 1).
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from algorithms.sampling import expert_rows_for
from trinity_like.buffer.rows import STATUSES
from trinity_like.config import load_plan
from trinity_like.runner import run_plan

RECIPE = Path(__file__).resolve().parents[2] / "examples" / "mix.yaml"
STEPS, PROMPTS, GROUP = 10, 2, 4
TINY = [
    "model.path=tiny-random",
    "trainer.engine=local",
    f"trainer.total_steps={STEPS}",
    "monitor.progress=false",
    f"explorer.batch_size={PROMPTS}",
    f"explorer.group_size={GROUP}",
    "trainer.micro_batch_size=3",
    "buffer.eval_tasks.size=4",
    "checkpoint.interval=1",  # a commit every step: the buffer records the step
]


def test_mix_trains_every_sampled_row_once_at_staleness_zero(tmp_path):
    plan = load_plan(RECIPE, [f"run_root={tmp_path}", *TINY])
    assert run_plan(plan) == 0
    cfg = plan.stages[0].config
    run_dir = Path(cfg.run_dir())
    steps = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in steps if "time/step" in r]
    assert [r["step"] for r in steps] == list(range(1, STEPS + 1))
    rollouts = PROMPTS * GROUP
    n_expert = expert_rows_for(rollouts, cfg.algorithm.sample_strategy["expert_ratio"])
    assert n_expert > 0
    for r in steps:
        assert r["staleness/mean"] == 0.0 and r["staleness/max"] == 0.0, r["step"]
        assert r["expert_rows"] == n_expert, r["step"]
        assert "loss" in r and r["expert_frac"] == pytest.approx(n_expert / (rollouts + n_expert)), r["step"]

    with sqlite3.connect(run_dir / "buffer.sqlite") as db:
        state = db.execute("SELECT status, model_version, step FROM state ORDER BY seq").fetchall()
    assert len(state) == STEPS * rollouts  # expert rows never enter the buffer
    assert {STATUSES[status] for status, _, _ in state} == {"consumed"}
    for step in range(1, STEPS + 1):  # each step consumed exactly the rows sampled for it
        consumed = [(version, s) for _, version, s in state if s == step]
        assert consumed == [(step - 1, step)] * rollouts, step
