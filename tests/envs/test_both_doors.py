"""One env, both front doors: the client loop (cookbook/rl/train.py) and
`run --config` with `explorer.workflow: env` each train the `arithmetic` env for 2 iterations
on the tiny model. The reward is the built-in `format` reward ("a reply without whitespace"),
which varies within a group on a random model, so both paths have something to learn."""

from __future__ import annotations

import json
import math
import sqlite3
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file

import trinity_like.client as tinker
from cookbook.rl.train import RLTrainConfig, train
from trinity_like.buffer.rows import unpack
from trinity_like.config import load_plan
from trinity_like.envs.dataset import build_env_factory
from trinity_like.explorer.tasks import ArithmeticParams, arithmetic_tasks
from trinity_like.models.resolve import resolve_model_path
from trinity_like.runner import run_plan

REPO = Path(__file__).resolve().parents[2]
ENV_ARGS = {"reward_fn": "format", "reward_params": {"pattern": r"\S+"}, "max_tokens": 8}
BATCH, GROUP = 2, 4


def test_the_client_loop_trains_the_env(tmp_path):
    with tinker.ServiceClient(log_dir=tmp_path / "client") as service:
        training = service.create_lora_training_client("tiny-random", rank=0, seed=0)
        tok = training.get_tokenizer()
        ids = tok.encode("What is 2 + 3? 5")
        probe = tinker.types.Datum(
            model_input=tinker.types.ModelInput.from_ints(ids[:-1]),
            loss_fn_inputs={"target_tokens": ids[1:], "weights": [1.0] * (len(ids) - 1)},
        )
        before = training.forward([probe], "cross_entropy").result().loss_fn_outputs[0]["logprobs"].to_numpy()
        factory = build_env_factory("arithmetic", ENV_ARGS, tokenizer=tok)
        config = RLTrainConfig(
            log_path=str(tmp_path / "run"),
            iterations=2,
            batch_size=BATCH,
            group_size=GROUP,
            learning_rate=1e-5,
            eval_every=0,
            save_every=0,
            progress=False,
        )
        tasks = arithmetic_tasks(ArithmeticParams(), "train", 2 * BATCH)
        result = train(config, training, factory, tasks)
        after = training.forward([probe], "cross_entropy").result().loss_fn_outputs[0]["logprobs"].to_numpy()
    assert [m["step"] for m in result.metrics] == [1, 2]
    for m in result.metrics:  # a group whose rewards are all equal is left out, whole
        assert m["rollout/episodes"] == BATCH * GROUP
        assert m["train/datums"] == (BATCH - m["train/skipped_groups"]) * GROUP
    trained = [m for m in result.metrics if m["train/datums"]]
    assert trained and all(math.isfinite(m["loss"]) and m["train/grad_norm"] > 0 for m in trained)
    assert not np.array_equal(before, after)  # the weights moved
    logged = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in logged] == [1, 2] and logged[1]["train/datums"] == result.metrics[1]["train/datums"]


def test_a_recipe_trains_the_same_env(tmp_path):
    env = json.dumps({"env": "arithmetic", "env_args": ENV_ARGS})
    overrides = [
        f"run_root={tmp_path}",
        "model.path=tiny-random",
        "trainer.engine=local",
        "trainer.total_steps=2",
        f"explorer.batch_size={BATCH}",
        f"explorer.group_size={GROUP}",
        f"explorer.workflow_args={env}",
        "algorithm.dynamic_sampling=false",
        "buffer.eval_tasks.size=4",
        "monitor.progress=false",
        "checkpoint.interval=2",
    ]
    plan = load_plan(REPO / "examples" / "multiturn_tool.yaml", overrides)
    assert run_plan(plan) == 0
    run_dir = Path(plan.stages[0].config.run_dir())
    steps = [r for r in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines()) if "loss" in r]
    assert [r["step"] for r in steps] == [1, 2]
    assert all(math.isfinite(r["loss"]) and r["actor/grad_norm"] > 0 for r in steps)
    assert all(r["workflow/experiences"] == BATCH * GROUP for r in steps)
    with sqlite3.connect(run_dir / "buffer.sqlite") as db:
        stored = [unpack(*row) for row in db.execute("select kind, header, arrays from rows")]
    assert len(stored) == 2 * BATCH * GROUP and all(e.info["turns"] == 1 for e in stored)
    base = load_file(resolve_model_path("tiny-random") / "model.safetensors")
    trained = load_file(run_dir / "checkpoints" / "step_000002" / "model" / "model.safetensors")
    assert any(not torch.equal(base[k], trained[k]) for k in base)  # the weights moved
