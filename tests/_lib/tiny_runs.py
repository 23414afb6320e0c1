"""The default recipe shrunk to the tiny model and the local engine: shared by the pipeline tests."""

from __future__ import annotations

from pathlib import Path

from trinity_like.config import load_plan
from trinity_like.runner import run_plan

REPO = Path(__file__).resolve().parents[2]
RECIPE = REPO / "examples" / "grpo_arith.yaml"
TINY = [
    "model.path=tiny-random",
    "trainer.engine=local",
    "buffer.eval_tasks.size=8",
    "explorer.batch_size=4",
    "explorer.group_size=4",
    "monitor.progress=false",
    "checkpoint.interval=1",
    # A random tiny model never answers right: reward "contains a digit" instead, so groups
    # differ, advantages are non-zero and every step really changes the weights.
    "explorer.reward_fn=format",
    "explorer.reward_args={pattern: '.*[0-9].*'}",
    "explorer.eval_reward_fn=exact_match",
]


def run(tmp_path: Path, *overrides: str) -> Path:
    plan = load_plan(RECIPE, [f"run_root={tmp_path}", *TINY, *overrides])
    assert run_plan(plan) == 0
    return Path(plan.stages[0].config.run_dir())


def final_weights(run_dir: Path) -> bytes:
    latest = (run_dir / "checkpoints" / "latest").read_text().strip()
    return (run_dir / "checkpoints" / latest / "model" / "model.safetensors").read_bytes()
