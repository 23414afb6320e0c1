"""The gold reward beside a learned one during RL, and the divergence stop, on the tiny model.

The constructed divergence: the trained reward is the *negation* of the gold one (a
``composite`` of one term with weight -1), so every step that raises the trained reward
lowers the gold reward by exactly as much."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trinity_like.cli import main
from trinity_like.config import load_plan
from trinity_like.config.engine_params import gold_reward
from trinity_like.config.schema import ExplorerConfig
from trinity_like.models.resolve import load_model
from trinity_like.runner import run_plan

REPO = Path(__file__).resolve().parents[2]
RECIPE = REPO / "examples" / "grpo_arith.yaml"
DIGIT = "{pattern: '.*[0-9].*'}"  # the random tiny model never adds right; "has a digit" varies
TINY = [
    "model.path=tiny-random",
    "trainer.engine=local",
    "buffer.eval_tasks.size=4",
    "explorer.batch_size=4",
    "explorer.group_size=4",
    "monitor.progress=false",
    "monitor.backends=[jsonl]",
    "checkpoint.interval=100",
    "explorer.reward_fn=composite",
    f"explorer.reward_args={{terms: [{{name: format, weight: -1.0, args: {DIGIT}}}]}}",
    "explorer.gold_reward_fn=format",
    f"explorer.gold_reward_args={DIGIT}",
    "explorer.eval_reward_fn=exact_match",
]


def metrics(run_dir: Path) -> dict[int, dict]:
    by_step: dict[int, dict] = {}
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        row = json.loads(line)
        by_step.setdefault(row["step"], {}).update(row)
    return by_step


def test_gold_reward_defaults_to_the_eval_reward_when_it_is_not_the_trained_one():
    assert gold_reward(
        ExplorerConfig(reward_fn="reward_model", eval_reward_fn="exact_match", eval_reward_args={"x": 1})
    ) == ("exact_match", {"x": 1})
    assert gold_reward(ExplorerConfig(reward_fn="exact_match", eval_reward_fn="exact_match")) == ("", {})
    assert gold_reward(ExplorerConfig(reward_fn="reward_model")) == ("", {})  # no verifier named
    assert gold_reward(ExplorerConfig(reward_fn="reward_model", eval_reward_fn="exact_match", gold_reward_fn="")) == (
        "",
        {},
    )
    assert gold_reward(ExplorerConfig(gold_reward_fn="format", gold_reward_args={"reward": 2.0})) == (
        "format",
        {"reward": 2.0},
    )


def test_every_rollout_gets_the_gold_reward_logged_beside_the_trained_one_which_alone_trains(tmp_path):
    plan = load_plan(RECIPE, [f"run_root={tmp_path}", *TINY, "trainer.total_steps=2"])
    assert run_plan(plan) == 0
    run_dir = Path(plan.stages[0].config.run_dir())
    rows = metrics(run_dir)
    for step in (1, 2):
        m = rows[step]
        assert 0.0 < m["reward/gold_mean"] < 1.0  # some responses have a digit, some not
        assert m["reward/mean"] == pytest.approx(-m["reward/gold_mean"])  # trained on the negation
        assert m["reward/gold_corr"] == pytest.approx(-1.0)
        assert m["workflow/gold_errors"] == 0.0
    # the buffer holds the trained reward; the gold one rides along in info
    import sqlite3

    con = sqlite3.connect(run_dir / "buffer.sqlite")
    found = 0
    for (header,) in con.execute("select header from rows where kind = 'experience'"):
        e = json.loads(header)
        found += 1
        assert e["reward"] == -e["info"]["gold_reward"]
    assert found == 2 * 16


def test_gold_falling_while_the_learned_reward_rises_stops_the_run_with_the_best_by_gold_weights(tmp_path, capsys):
    args = [
        "run",
        "--config",
        str(RECIPE),
        f"run_root={tmp_path}",
        *TINY,
        "trainer.total_steps=12",
        "trainer.optimizer.lr=0.02",
        "monitor.stop_on_reward_hacking=true",
        "monitor.reward_hacking_window=2",
    ]
    assert main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "reward hacking? the gold reward fell over the last 2 steps" in err
    assert "stopped (monitor.stop_on_reward_hacking)" in err
    run_dir = tmp_path / "grpo_arith"
    best = json.loads((run_dir / "best_gold" / "best_gold.json").read_text())
    logged = {s: m["reward/gold_mean"] for s, m in metrics(run_dir).items() if "reward/gold_mean" in m}
    top = max(logged.values())
    assert best["gold_mean"] == pytest.approx(top) and best["step"] == min(s for s, g in logged.items() if g == top)
    assert best["version"] == best["step"] - 1  # sampled by the weights trained up to the step before
    assert f"those after step {best['version']} " in err and str(run_dir / "best_gold") in err
    assert len(logged) < 12  # stopped early
    load_model(str(run_dir / "best_gold"))  # a model folder that loads


def test_the_check_at_start_ranks_the_trained_reward_against_the_gold_one(tmp_path, capsys):
    plan = load_plan(
        RECIPE,
        [f"run_root={tmp_path}", *TINY, "trainer.total_steps=1", "monitor.rm_check_tasks=4", "explorer.group_size=6"],
    )
    assert run_plan(plan) == 0
    start = metrics(Path(plan.stages[0].config.run_dir()))[0]
    assert start["rm_check/samples"] == 4 * 6 and 0 < start["rm_check/right_frac"] < 1
    # the trained reward is minus the gold one: every right answer scores below every wrong one
    assert start["rm_check/auc"] == 0.0
    assert start["rm_check/prompts_with_both"] > 0 and start["rm_check/auc_within_prompt"] == 0.0
    assert "reward check at start (4 held-out tasks x 6, gold right" in capsys.readouterr().out
