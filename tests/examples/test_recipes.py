"""Every example recipe runs 2 steps on the tiny model (the recipes' smoke tests)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from trinity_like.config import load_plan
from trinity_like.runner import run_plan

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
RECIPES = sorted(p.name for p in EXAMPLES.iterdir() if p.suffix in (".yaml", ".toml"))
TINY = [
    "model.path=tiny-random",
    "trainer.engine=local",
    "trainer.total_steps=2",
    "monitor.progress=false",
    "checkpoint.interval=1",
]


def tiny_overrides(recipe: str, plan_cfg) -> list[str]:
    """Shrink a recipe to seconds: tiny model, 2 steps, small batches and eval sets."""
    out = list(TINY) + ["trainer.micro_batch_size=3"]  # several micro-batches per step, an uneven last one
    raw = plan_cfg
    if raw.buffer.tasks is not None:
        out += ["explorer.batch_size=2", "explorer.group_size=4"]
    if raw.buffer.eval_tasks is not None:
        out += ["buffer.eval_tasks.size=4"]
    if raw.buffer.train_batch_size:
        out += ["buffer.train_batch_size=4"]
    for key in ("train_data", "eval_data"):
        ds = getattr(raw.buffer, key)
        if ds is not None and ds.pairs_from_samples:  # pairs sampled from the model: a few tasks
            out += [f"buffer.{key}.size=6", f"buffer.{key}.pairs_from_samples=3"]
    return out


def metrics_of(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def run_recipe(recipe: str, tmp_path: Path, extra: list[str] = ()) -> list[Path]:
    base = load_plan(EXAMPLES / recipe).stages[0].config
    overrides = [f"run_root={tmp_path}", *tiny_overrides(recipe, base), *extra]
    if recipe.startswith("sft_then"):
        overrides = [o for o in overrides if not o.startswith(("trainer.total_steps", "buffer.train_batch_size"))]
        overrides += [
            "stages.0.trainer.total_steps=2",
            "stages.1.trainer.total_steps=2",
            "stages.0.buffer.train_batch_size=4",
        ]
    plan = load_plan(EXAMPLES / recipe, overrides)
    assert run_plan(plan) == 0
    return [Path(s.config.run_dir()) for s in plan.stages]


# Recipes that need something first run in their own tests below: a trained reward model, a plugin.
NEEDS_SETUP = ("grpo_with_rm.yaml", "grpo_with_rm_hacking.yaml", "grpo_tis.yaml")


@pytest.mark.parametrize("recipe", [r for r in RECIPES if r not in NEEDS_SETUP])
def test_recipe_runs_two_steps_on_the_tiny_model(recipe, tmp_path):
    for run_dir in run_recipe(recipe, tmp_path):
        rows = metrics_of(run_dir)
        steps = [r for r in rows if "time/step" in r]
        assert [r["step"] for r in steps] == [1, 2], recipe
        # a step either trained, or had no learning signal at all (DAPO drops equal-reward groups)
        assert all("loss" in r or r.get("skipped/no_signal") == 1.0 for r in steps), recipe
        assert (run_dir / "checkpoints" / "step_000002" / "model" / "config.json").exists()
        if recipe.startswith("mix"):  # expert rows ride along on top; the reward is the rollouts' alone
            # every sampled row is trained in the step that sampled it (expert rows carry no version)
            assert all(r["expert_rows"] > 0 and 0 <= r["reward/mean"] <= 1 and r["staleness/max"] == 0 for r in steps)
        if recipe == "multiturn_tool.yaml":  # whole episodes: every task's, none skipped
            assert all(r["rollout/episodes"] >= 8 and r["workflow/skipped_tasks"] == 0 for r in steps)
        if recipe == "ppo.yaml":  # the critic trains beside the policy, its loss under its own name
            assert all(r["critic/value_loss"] == r["critic/loss"] and "critic/policy_loss" not in r for r in steps)
        if load_plan(EXAMPLES / recipe).stages[-1].config.buffer.eval_tasks is not None:
            # held-out answer accuracy at the start and the end, offline stages (SFT, DPO) included
            evaluated = [r["step"] for r in rows if "eval/accuracy" in r]
            assert evaluated[-1] == 2 and (evaluated[0] == 0 or recipe.startswith("sft_then")), (recipe, evaluated)


# On verl: the online default (explorer, then the actor's workers) and the offline stage with the most
# parts (pairs kept together over the workers, and a frozen reference group beside the actor). Two verl
# starts a recipe takes minutes on 2 cores, so the others are covered where it costs less: SFT's loss in
# the workers by tests/trainer/test_metric_invariance.py (every loss, verl against local), and SFT's
# offline loop is DPO's without the pairs; multi-turn rows' loss masks (env tokens left out inside the
# response) by the parity test of tests/trainer/test_verl_engine.py (its batches mask such tokens), and
# the episodes themselves by the local run of multiturn_tool.yaml above.
@pytest.mark.slow
@pytest.mark.parametrize("recipe", ["grpo_arith.yaml", "dpo.yaml"])
def test_recipe_on_the_verl_engine_with_two_cpu_workers(recipe, tmp_path):
    """The real default path: verl's FSDP workers through Ray, 2 workers over gloo."""
    import ray

    try:
        (run_dir,) = run_recipe(recipe, tmp_path, ["trainer.engine=verl", "cluster.trainer_workers=2"])
    finally:
        ray.shutdown()
    steps = [r for r in metrics_of(run_dir) if "time/step" in r]
    assert [r["step"] for r in steps] == [1, 2]
    assert all("loss" in r or r.get("skipped/no_signal") == 1.0 for r in steps)


def test_grpo_with_a_reward_model_trained_by_the_rm_recipe(tmp_path):
    (rm_dir,) = run_recipe("rm_tiny.yaml", tmp_path / "rm")
    (run_dir,) = run_recipe("grpo_with_rm.yaml", tmp_path / "grpo", [f"explorer.reward_args.path={rm_dir}"])
    rewards = [r["reward/mean"] for r in metrics_of(run_dir) if "reward/mean" in r]
    assert rewards and all(isinstance(v, float) for v in rewards)
    # a learned reward is a real-valued score, not the 0/1 of exact match
    assert any(v not in (0.0, 1.0) for v in rewards)


@pytest.mark.slow
def test_grpo_tis_runs_with_the_example_plugin_installed(tmp_path):
    """The recipe of a third-party algorithm: the example plugin pip-installed, run through the CLI."""
    target = tmp_path / "site"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "--disable-pip-version-check",
            "--target",
            str(target),
            str(EXAMPLES.parent / "plugins" / "example_plugin"),
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )
    env = {**os.environ, "PYTHONPATH": str(target), "RAY_AUTH_MODE": "disabled"}
    env.pop("TRINITY_LIKE_PLUGINS", None)  # found through its entry point only
    overrides = [
        f"run_root={tmp_path / 'runs'}",
        *TINY,
        "trainer.micro_batch_size=3",
        "explorer.batch_size=2",
        "explorer.group_size=4",
        "buffer.eval_tasks.size=4",
    ]
    out = subprocess.run(
        [sys.executable, "-m", "trinity_like.cli", "run", "--config", str(EXAMPLES / "grpo_tis.yaml"), *overrides],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    steps = [r for r in metrics_of(tmp_path / "runs" / "grpo_tis") if "time/step" in r]
    assert [r["step"] for r in steps] == [1, 2]
    # the plugin's loss ran: its own metric is logged beside the policy loss
    assert all("policy_loss" in r and "tis/truncated_frac" in r for r in steps), steps


def test_a_stage_starts_from_a_lora_stage_merged_into_its_base(tmp_path):
    """SFT with a LoRA adapter, then GRPO from it: the runner merges the adapter into its base
    (runs/<name>/sft/merged/step_N) and the next stage starts from that plain folder."""
    sft, grpo = run_recipe("sft_then_grpo.yaml", tmp_path, ["model.lora_rank=4"])
    merged = sft / "merged" / "step_000002"
    assert (merged / "config.json").is_file() and any(merged.glob("*.safetensors"))
    assert metrics_of(grpo)[-1]["step"] == 2
