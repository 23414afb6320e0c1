"""A rerun that starts from step 0 in a folder an earlier run wrote (it saved no checkpoint, or
`checkpoint.resume: false`) says so in one line and starts clean: the earlier files are moved to
`<name>.old-<k>`, whole, and no step is logged twice (trinity_like/pipeline/run_dir.py)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from trinity_like.config import load_plan
from trinity_like.runner import run_plan

GSM = Path(__file__).resolve().parents[2] / "examples" / "gsm8k_style.yaml"
TINY = [
    "model.path=tiny-random",
    "model.max_response_tokens=4",
    "trainer.total_steps=1",
    "explorer.batch_size=2",
    "explorer.group_size=2",
    "buffer.eval_tasks.size=2",
    "monitor.progress=false",
    "monitor.backends=[jsonl]",
]


def steps(run_dir: Path) -> list[int]:
    return [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def run(tmp_path: Path, *extra: str) -> Path:
    plan = load_plan(GSM, [f"run_root={tmp_path}", *TINY, *extra])
    assert run_plan(plan) == 0
    return Path(plan.stages[0].config.run_dir())


def test_a_rerun_without_a_checkpoint_moves_the_earlier_files_aside_and_says_so(tmp_path, capfd):
    run_dir = run(tmp_path)
    first, once = (run_dir / "metrics.jsonl").read_text(), steps(run_dir)
    assert sorted(set(once)) == [0, 1]
    # what a run stopped before its first save leaves: its record, no checkpoint
    shutil.rmtree(run_dir / "checkpoints")
    capfd.readouterr()
    run(tmp_path)
    out = capfd.readouterr().out
    aside = tmp_path / "gsm8k_style.old-1"
    assert f"{run_dir}: starting a clean run; the earlier run's files moved to {aside} (it saved no checkpoint" in out
    assert steps(run_dir) == once  # not twice over: plot and view draw each step once
    assert (aside / "metrics.jsonl").read_text() == first and (aside / "evals.jsonl").exists()
    # a resume continues in place; resume: false starts clean again, the next free name
    run(tmp_path, "trainer.total_steps=2")
    resumed = steps(run_dir)
    assert resumed[: len(once)] == once and max(resumed) == 2 and not (tmp_path / "gsm8k_style.old-2").exists()
    run(tmp_path, "checkpoint.resume=false")
    assert steps(run_dir) == once and steps(tmp_path / "gsm8k_style.old-2") == resumed
    assert (tmp_path / "gsm8k_style.old-2" / "checkpoints").is_dir()  # moved, never deleted
