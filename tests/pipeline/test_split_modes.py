"""Modes ``explore`` and ``train``: explorer and trainer as two processes on one run directory."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from _lib.tiny_runs import RECIPE, TINY, final_weights, run

from trinity_like.pipeline.weight_channel import WeightChannel
from trinity_like.pipeline.weight_ledger import needed_version

STEPS = ["trainer.total_steps=4", "checkpoint.interval=2"]


def start(tmp_path: Path, mode: str, *extra: str) -> subprocess.Popen:
    args = [
        sys.executable,
        "-m",
        "trinity_like.cli",
        "run",
        "--config",
        str(RECIPE),
        f"run_root={tmp_path}",
        *TINY,
        *STEPS,
        f"mode={mode}",
        *extra,
    ]
    return subprocess.Popen(
        args,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "RAY_AUTH_MODE": "disabled"},
    )


def finish(proc: subprocess.Popen) -> str:
    out, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, out
    return out


def rows_of(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_two_processes_train_exactly_what_one_process_trains(tmp_path):
    """Same seed, offset 0: explorer + trainer processes end with the weights of ``mode: both``."""
    trainer = start(tmp_path / "split", "train")  # the trainer first: it waits for experiences
    explorer = start(tmp_path / "split", "explore")
    finish(explorer), finish(trainer)
    split = tmp_path / "split" / "grpo_arith"
    both = run(tmp_path / "both", *STEPS)
    assert final_weights(split) == final_weights(both)

    explored = [r for r in rows_of(split / "explorer" / "metrics.jsonl") if "time/rollout" in r]
    assert [r["step"] for r in explored] == [1, 2, 3, 4]
    assert [r["explorer/model_version"] for r in explored] == [0, 1, 2, 3]  # on-policy schedule
    evals = [r for r in rows_of(split / "explorer" / "metrics.jsonl") if "eval/accuracy" in r]
    assert [r["step"] for r in evals] == [0, 4] and evals[-1]["explorer/model_version"] == 4
    trained = [r for r in rows_of(split / "metrics.jsonl") if "time/update" in r]
    assert [r["step"] for r in trained] == [1, 2, 3, 4]
    assert all(r["staleness/max"] == 0 for r in trained)
    assert WeightChannel(split).latest() == 4


def test_explorer_killed_mid_run_resumes_and_the_run_completes(tmp_path):
    trainer = start(tmp_path, "train", "trainer.total_steps=6")
    explorer = start(tmp_path, "explore", "trainer.total_steps=6")
    state = tmp_path / "grpo_arith" / "explorer" / "state.json"
    deadline = time.monotonic() + 300
    while not (state.exists() and json.loads(state.read_text())["step"] >= 2):
        assert time.monotonic() < deadline and explorer.poll() is None
        time.sleep(0.1)
    explorer.send_signal(signal.SIGKILL)
    explorer.wait()
    explorer = start(tmp_path, "explore", "trainer.total_steps=6")
    out = finish(explorer)
    assert "explorer resumed after step" in out
    finish(trainer)
    trained = [r for r in rows_of(tmp_path / "grpo_arith" / "metrics.jsonl") if "time/update" in r]
    assert [r["step"] for r in trained] == [1, 2, 3, 4, 5, 6]


def test_the_explorer_waits_for_the_weights_its_schedule_needs():
    # offset 0: batch t is sampled by the weights of step t - 1
    assert [needed_version(t, 0, 1) for t in (1, 2, 5)] == [0, 1, 4]
    # offset 2: up to two steps ahead
    assert [needed_version(t, 2, 1) for t in (1, 3, 4, 6)] == [0, 0, 1, 3]
    # weights published every 2 steps: the newest published version at or below the need
    assert [needed_version(t, 0, 2) for t in (2, 3, 4, 5)] == [0, 2, 2, 4]


def test_weight_channel_publishes_atomically_and_keeps_the_last_two(tmp_path):
    channel = WeightChannel(tmp_path)
    assert channel.latest() is None

    def save(folder: str) -> None:
        Path(folder).mkdir()
        (Path(folder) / "model.safetensors").write_text(folder)

    for v in (1, 2, 3):
        channel.publish(v, save)
    assert channel.versions() == [2, 3] and channel.latest() == 3
    (tmp_path / "sync" / "v000004.tmp").mkdir()  # a writer killed mid-save: not a version
    assert channel.latest() == 3
    channel.publish(4, save)
    assert channel.versions() == [3, 4] and not (tmp_path / "sync" / "v000004.tmp").exists()


def test_split_modes_refuse_what_cannot_cross_processes(tmp_path):
    def validate(*extra: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "trinity_like.cli", "validate", str(RECIPE), *TINY, *extra],
            capture_output=True,
            text=True,
            timeout=300,
        )

    out = validate("mode=train", "synchronizer.method=memory")
    assert out.returncode == 2 and out.stderr.count("\n") == 1
    assert "synchronizer.method" in out.stderr and "separate processes" in out.stderr
    out = validate("mode=explore", "buffer.experience.storage=memory")
    assert out.returncode == 2 and out.stderr.count("\n") == 1
    assert "buffer.experience.storage" in out.stderr and "sqlite" in out.stderr
    assert validate("mode=explore").returncode == 0
