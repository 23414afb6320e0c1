"""End-to-end runs of the default recipe on the tiny model (local engine): metrics, resume, bench."""

from __future__ import annotations

import json
import sqlite3

import pytest
from _lib.tiny_runs import RECIPE, TINY, final_weights, run

from trinity_like.buffer.rows import unpack
from trinity_like.config import load_plan
from trinity_like.runner import run_plan


def test_two_steps_log_metrics_and_checkpoint(tmp_path):
    run_dir = run(tmp_path, "trainer.total_steps=2")
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r["step"] for r in rows]
    assert steps[0] == 0 and "eval/accuracy" in rows[0]  # evaluated before training
    trained = [r for r in rows if "time/rollout" in r]
    assert [r["step"] for r in trained] == [1, 2]
    for key in (
        "reward/mean",
        "reward/std",
        "response_length/mean",
        "staleness/mean",
        "time/update",
        "time/sync",
        "throughput/tokens_per_s",
        "actor/grad_norm",
        "perf/train_tokens",
        "perf/padded_fraction",
        "perf/batch_tokens",
        "time/update.forward_backward",
        "time/update.optim_step",
        "time/sync.gather",
        "memory/driver_gb",
        "memory/total_gb",
    ):
        assert key in trained[-1], key
    assert 0 < trained[-1]["memory/driver_gb"] <= trained[-1]["memory/total_gb"]
    for r in trained:  # the update's parts lie inside it; the batch's real tokens are what throughput counts
        assert 0 < r["time/update.forward_backward"] + r["time/update.optim_step"] <= r["time/update"]
        assert r["time/sync.gather"] <= r["time/sync"]
        assert r["perf/batch_tokens"] == pytest.approx(r["throughput/tokens_per_s"] * r["time/step"])
    assert "eval/accuracy" in rows[-1] and "eval/response_length" in rows[-1]
    assert (run_dir / "checkpoints" / "step_000002" / "manifest.json").exists()
    assert any((run_dir / "tensorboard").iterdir())


def test_throughput_is_the_tokens_a_step_trained_on_over_its_time(tmp_path):
    """``throughput/tokens_per_s`` of a local-engine run: the real tokens (prompt and response) of
    the rows each step trained on, read back from the buffer's record of what it trained, over
    the step's ``time/step``."""
    run_dir = run(tmp_path, "trainer.total_steps=2")
    lines = map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines())
    logged = {r["step"]: r for r in lines if "time/step" in r}  # a step's own line (not its checkpoint's)
    db = sqlite3.connect(run_dir / "buffer.sqlite")
    tokens: dict[int, int] = {}
    for step, kind, header, blob in db.execute(
        "SELECT t.step, r.kind, r.header, r.arrays FROM trained t JOIN rows r USING (seq)"
    ):
        tokens[step] = tokens.get(step, 0) + len(unpack(kind, header, blob).tokens)
    db.close()
    assert set(tokens) == {1, 2}
    for step in (1, 2):
        row = logged[step]
        assert row["throughput/tokens_per_s"] > 0
        assert row["throughput/tokens_per_s"] == pytest.approx(tokens[step] / row["time/step"], rel=1e-9)


def test_a_step_that_trains_nothing_logs_no_throughput_and_says_why(tmp_path, capsys):
    """Every answer of the random model gets the same reward: dynamic sampling drops every group,
    nothing is trained, and the step says so instead of logging a throughput of 0."""
    run_dir = run(tmp_path, "trainer.total_steps=1", "explorer.reward_args={pattern: '(?!)'}")
    step = next(r for r in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines()) if "time/step" in r)
    assert step["skipped/no_signal"] == 1.0 and step["dynamic_sampling/dropped_rows"] == 16.0
    assert "throughput/tokens_per_s" not in step
    assert "step 1: every group's rewards are equal: dynamic sampling dropped all 16 rows" in capsys.readouterr().out


def test_stop_at_5_and_resume_equals_uninterrupted_10_steps(tmp_path):
    straight = run(tmp_path / "a", "trainer.total_steps=10")
    run(tmp_path / "b", "trainer.total_steps=5")
    resumed = run(tmp_path / "b", "trainer.total_steps=10")
    assert final_weights(resumed) == final_weights(straight)
    rows = [json.loads(line) for line in (straight / "metrics.jsonl").read_text().splitlines()]
    assert sum(r.get("actor/grad_norm", 0.0) > 0 for r in rows) >= 8, "the steps must really train"
    rows = [json.loads(line) for line in (resumed / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "time/rollout" in r] == list(range(1, 11))


def test_bench_mode_evaluates_every_checkpoint(tmp_path):
    run(tmp_path, "trainer.total_steps=2", "checkpoint.keep_last=5")
    plan = load_plan(RECIPE, [f"run_root={tmp_path}", *TINY, "mode=bench"])
    assert run_plan(plan) == 0
    rows = [json.loads(line) for line in (tmp_path / "grpo_arith" / "bench" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    assert all(0.0 <= r["eval/accuracy"] <= 1.0 for r in rows)


def test_bench_mode_evaluates_lora_checkpoints_merged_into_their_base(tmp_path):
    lora = ["model.lora_rank=4", "checkpoint.keep_last=5"]
    run(tmp_path, "trainer.total_steps=2", *lora)
    assert (tmp_path / "grpo_arith" / "checkpoints" / "step_000002" / "model" / "adapter_config.json").exists()
    plan = load_plan(RECIPE, [f"run_root={tmp_path}", *TINY, *lora, "mode=bench"])
    assert run_plan(plan) == 0
    rows = [json.loads(line) for line in (tmp_path / "grpo_arith" / "bench" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
