"""LoRA as a recipe option: the ``model.lora_*`` keys, what reaches the engines, and the
combinations a recipe cannot run yet, each refused in one line before anything trains, and
an adapter on a tied output layer run end to end."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from trinity_like.config import load_plan
from trinity_like.config.engine_params import build_engine
from trinity_like.config.schema import Config
from trinity_like.errors import ConfigError
from trinity_like.models.tiny import build_tiny_model
from trinity_like.trainer.local_engine import LocalEngine
from trinity_like.trainer.lora import LoraParams

EXAMPLES = Path(__file__).parents[2] / "examples"


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory) -> str:
    return str(build_tiny_model(tmp_path_factory.mktemp("tiny") / "model", seed=3))


def test_recipe_keys_validate_and_typos_are_errors():
    plan = load_plan(
        EXAMPLES / "grpo_arith.yaml", ["model.lora_rank=8", "model.lora_alpha=16", "model.lora_train_unembed=false"]
    )
    m = plan.stages[0].config.model
    assert (m.lora_rank, m.lora_alpha, m.lora_train_attn, m.lora_train_mlp, m.lora_train_unembed) == (
        8,
        16.0,
        True,
        True,
        False,
    )
    with pytest.raises(ConfigError, match="did you mean 'lora_rank'"):
        load_plan(EXAMPLES / "grpo_arith.yaml", ["model.lora_rnak=8"])
    with pytest.raises(ConfigError, match="model.lora_rank"):
        load_plan(EXAMPLES / "grpo_arith.yaml", ["model.lora_rank=-1"])


def test_build_engine_trains_an_adapter_on_the_policy_only(tiny_path):
    cfg = Config.model_validate(
        {"seed": 5, "trainer": {"engine": "local"}, "model": {"lora_rank": 4, "lora_train_unembed": False}}
    )
    actor = build_engine(cfg, tiny_path)
    assert isinstance(actor, LocalEngine)
    assert actor.params.lora == LoraParams(rank=4, train_unembed=False, seed=5)
    adapted = {n for n, _ in actor.model.named_parameters() if ".lora_A." in n}
    assert adapted and not any("lm_head" in n for n in adapted)
    assert build_engine(cfg, tiny_path, forward_only=True).params.lora is None
    assert build_engine(cfg, tiny_path, kind="value", critic=True).params.lora is None


def test_a_grpo_recipe_trains_an_adapter_on_a_tied_output_layer_end_to_end(tmp_path):
    """tiny-random ties its output layer; with lora_train_unembed (the default) the merged
    weights carry a trained lm_head and the explorer unties its model to hold them: the run
    finishes and its samples come from the trained weights (rollout logprobs match the trainer's)."""
    cmd = [
        sys.executable,
        "-m",
        "trinity_like.cli",
        "run",
        "--config",
        str(EXAMPLES / "grpo_arith.yaml"),
        f"run_root={tmp_path}",
        "model.path=tiny-random",
        "trainer.engine=local",
        "trainer.total_steps=2",
        "trainer.micro_batch_size=8",
        "explorer.batch_size=2",
        "explorer.group_size=4",
        "monitor.progress=false",
        "buffer.eval_tasks.size=4",
        "model.lora_rank=4",
        "trainer.optimizer.lr=0.05",
        # rewards that differ within a group on a random model: responses with an even length
        "explorer.reward_fn=format",
        "explorer.reward_args.pattern=(..)*",
    ]
    out = subprocess.run(
        cmd, capture_output=True, text=True, timeout=600, env={**os.environ, "RAY_AUTH_MODE": "disabled"}
    )
    assert out.returncode == 0, out.stderr[-3000:]
    rows = [json.loads(line) for line in (tmp_path / "grpo_arith" / "metrics.jsonl").read_text().splitlines()]
    diffs = [r["rollout_logprob_diff"] for r in rows if "rollout_logprob_diff" in r]
    assert diffs and max(diffs) < 1e-4  # step 2 sampled from the synced, untied, merged weights
