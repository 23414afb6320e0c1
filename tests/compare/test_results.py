"""Reading a run back: resumed attempts, each kind's signal as benchmarks/signals.py defines it, compute sums."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trinity_like.compare.results import Keys, read_run, step_rows


def write(run_dir: Path, lines: list[dict]) -> Path:
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps({"time": 0.0, **r}) + "\n" for r in lines))
    return run_dir


def rl_step(step: int, reward: float, rows: float = 64, tokens: float = 1000, secs: float = 2.0) -> dict:
    return {
        "step": step,
        "reward/mean": reward,
        "time/step": secs,
        "perf/train_rows": rows,
        "perf/train_tokens": tokens,
    }


def test_an_rl_run_reads_like_signals_py(tmp_path):
    rewards = [0.05, 0.10, 0.15, 0.20, 0.30, 0.40, 0.45, 0.50]
    lines = [{"step": 0, "eval/accuracy": 0.21, "eval/tasks": 200.0}]
    for i, r in enumerate(rewards, 1):
        lines += [rl_step(i, r, rows=64 - i), {"step": i, "time/checkpoint": 0.1}]
    lines.append({"step": 8, "eval/accuracy": 0.55, "eval/tasks": 200.0})
    res = read_run([write(tmp_path / "run", lines)], Keys(), wall_s=99.0)
    assert res.steps == 8
    assert (res.accuracy_start, res.accuracy, res.accuracy_kind) == (0.21, 0.55, "held-out answer accuracy")
    assert res.signal.startswith("train reward (reward/mean), mean of first 3 steps -> last 3")
    assert res.signal_start == pytest.approx((0.05 + 0.10 + 0.15) / 3)
    assert res.signal_end == pytest.approx((0.40 + 0.45 + 0.50) / 3)
    assert res.rows == sum(64 - i for i in range(1, 9)) and res.tokens == 8000 and res.step_s == 16.0
    assert res.wall_s == 99.0
    assert res.accuracy_curve == [(0, 0.21), (8, 0.55)] and [s for s, _ in res.reward_curve] == list(range(1, 9))


def test_a_short_run_averages_half_its_steps(tmp_path):
    lines = [rl_step(1, 0.1), rl_step(2, 0.3), rl_step(3, 0.5), rl_step(4, 0.9)]
    res = read_run([write(tmp_path / "run", lines)], Keys())
    assert (res.signal_start, res.signal_end) == (pytest.approx(0.2), pytest.approx(0.7))
    assert "first 2 steps -> last 2" in res.signal and res.accuracy is None


def test_a_resumed_run_keeps_each_step_as_its_latest_attempt_logged_it():
    # first attempt: steps 1-3, killed after logging step 3 and before its checkpoint;
    # the second resumes from the step-2 checkpoint and redoes step 3, then runs to 4
    lines = [
        {"step": 0, "eval/accuracy": 0.2},
        {"step": 1, "time/step": 1, "reward/mean": 0.1},
        {"step": 1, "time/checkpoint": 0.1},
        {"step": 2, "time/step": 1, "reward/mean": 0.2, "skipped/no_signal": 1.0},
        {"step": 2, "time/checkpoint": 0.1},
        {"step": 3, "time/step": 1, "reward/mean": 0.9, "dropped": 5},
        {"step": 3, "time/step": 1, "reward/mean": 0.3},
        {"step": 3, "time/checkpoint": 0.1},
        {"step": 4, "time/step": 1, "reward/mean": 0.4},
        {"step": 4, "eval/accuracy": 0.5},
    ]
    rows = step_rows(lines)
    assert [r["step"] for r in rows] == [0, 1, 2, 3, 4]
    assert rows[3] == {
        "step": 3,
        "time/step": 1,
        "reward/mean": 0.3,
        "time/checkpoint": 0.1,
    }  # no trace of the lost attempt
    assert rows[2]["skipped/no_signal"] == 1.0  # kept: step 2 was not redone
    restarted = step_rows(
        [*lines[:6], {"step": 0, "eval/accuracy": 0.25}, {"step": 1, "time/step": 1, "reward/mean": 7}]
    )
    assert restarted == [{"step": 0, "eval/accuracy": 0.25}, {"step": 1, "time/step": 1, "reward/mean": 7}]


def test_offline_signals_sft_loss_dpo_margin_rm_pairwise(tmp_path):
    sft = read_run([write(tmp_path / "sft", [{"step": 0, "eval/nll": 2.6}, {"step": 5, "time/step": 1, "loss": 1},
                                             {"step": 5, "eval/nll": 0.3}])], Keys())  # fmt: skip
    assert (sft.signal, sft.signal_start, sft.signal_end) == (
        "held-out loss (eval/nll, NLL per assistant token)",
        2.6,
        0.3,
    )
    assert sft.signal_higher_is_better is False
    dpo = read_run([write(tmp_path / "dpo", [{"step": 0, "eval/reward_margin": 0.0, "eval/accuracy": 0.2, "eval/tasks": 8},
                                             {"step": 3, "eval/reward_margin": 0.05, "eval/accuracy": 0.19, "eval/tasks": 8}])], Keys())  # fmt: skip
    assert dpo.signal.startswith("held-out reward margin") and dpo.signal_end == 0.05 and dpo.accuracy == 0.19
    rm = read_run(
        [write(tmp_path / "rm", [{"step": 0, "eval/accuracy": 0.42}, {"step": 4, "eval/accuracy": 0.8}])], Keys()
    )
    assert rm.signal == "held-out pairwise accuracy (eval/accuracy)" and (rm.signal_start, rm.signal_end) == (0.42, 0.8)
    assert rm.accuracy_kind == "held-out accuracy"


def test_stages_sum_compute_and_start_accuracy_at_the_first_stage(tmp_path):
    sft = write(
        tmp_path / "sft", [{"step": 0, "eval/accuracy": 0.21, "eval/tasks": 8}, rl_step(1, 0.0, rows=16, tokens=500)]
    )
    grpo = write(tmp_path / "grpo", [{"step": 0, "eval/accuracy": 0.4, "eval/tasks": 8}, rl_step(1, 0.5), rl_step(2, 0.7),
                                     {"step": 2, "eval/accuracy": 0.6, "eval/tasks": 8}])  # fmt: skip
    res = read_run([sft, grpo], Keys())
    assert (res.accuracy_start, res.accuracy) == (0.21, 0.6)
    assert res.rows == 16 + 64 + 64 and res.tokens == 2500 and res.steps == 2


def test_a_script_names_its_own_keys(tmp_path):
    lines = [
        {"step": 0, "acc": 0.1},
        {"step": 1, "ret": 1.0, "datums": 8},
        {"step": 2, "ret": 3.0, "datums": 6, "acc": 0.3},
    ]
    keys = Keys(accuracy="acc", reward="ret", rows="datums", tokens="none", extra=("ret",))
    res = read_run([write(tmp_path / "s", lines)], keys)
    assert (res.accuracy, res.signal_start, res.signal_end, res.rows, res.tokens) == (0.3, 1.0, 3.0, 14.0, None)
    assert res.extra == {"ret": 3.0} and res.steps == 2
