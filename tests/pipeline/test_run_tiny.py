"""End-to-end runs of the default recipe on the tiny model (local engine): metrics, resume, bench."""

from __future__ import annotations

import json

from tiny_runs import RECIPE, TINY, final_weights, run

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
        "memory/driver_gb",
        "memory/total_gb",
    ):
        assert key in trained[-1], key
    assert 0 < trained[-1]["memory/driver_gb"] <= trained[-1]["memory/total_gb"]
    assert "eval/accuracy" in rows[-1] and "eval/response_length" in rows[-1]
    assert (run_dir / "checkpoints" / "step_000002" / "manifest.json").exists()
    assert any((run_dir / "tensorboard").iterdir())


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
