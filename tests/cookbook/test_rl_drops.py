"""Env failures in the client loop (cookbook/rl): each distinct one written once with the env's
name and the error, every drop counted, and an iteration that drops more than
``max_dropped_fraction`` of its groups stops the run with the first drop's error."""

from __future__ import annotations

import json

import pytest

import trinity_like.client as tinker
from cookbook.rl.core import evaluate
from cookbook.rl.train import RLTrainConfig, train
from trinity_like.client.sampling import SamplingClient
from trinity_like.envs.dataset import TaskGroupBuilder
from trinity_like.envs.guard import DropNotices
from trinity_like.envs.types import Env, EnvFactory, StepResult, StopCondition
from trinity_like.errors import ConfigError, TrinityError
from trinity_like.explorer.tasks import ArithmeticParams, arithmetic_tasks
from trinity_like.models.chat import render_prompt

DOWN = "ValueError: tool server unreachable"


class Fragile(Env):
    """One turn; a task named in ``errors`` raises that error at every step, the others score the
    parity of the action's first token."""

    metric_names = ("odd", "calls")  # `calls` is never reported: logged as 0

    def __init__(self, tok, task, error):
        self.prompt, self.error = render_prompt(tok, task.messages()), error

    def initial_observation(self):
        return list(self.prompt), StopCondition(max_tokens=3)

    def step(self, action):
        if self.error is not None:
            raise self.error
        return StepResult(float(action[0] % 2), True, metrics={"odd": float(action[0] % 2)})


class FragileEnvs(EnvFactory):
    def __init__(self, *, tokenizer, errors=None):
        self.tok, self.errors = tokenizer, dict(errors or {})

    def group_builder(self, task, group_size):
        return TaskGroupBuilder(task, group_size, lambda: Fragile(self.tok, task, self.errors.get(task.task_id)))


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    with tinker.ServiceClient(log_dir=tmp_path_factory.mktemp("client")) as s:
        yield s


@pytest.fixture(scope="module")
def tok(service):
    return SamplingClient("tiny-random").get_tokenizer()


def tasks(n, split="train"):
    return arithmetic_tasks(ArithmeticParams(), split, n)


def config(tmp_path, **overrides):
    values = {
        "log_path": str(tmp_path / "run"),
        "iterations": 2,
        "batch_size": 2,
        "group_size": 2,
        "eval_every": 0,
        "save_every": 0,
        "progress": False,
    }
    return RLTrainConfig(**{**values, **overrides})


def everything_fails(train_tasks):
    return {t.task_id: ValueError("tool server unreachable") for t in train_tasks}


@pytest.mark.parametrize("stream", [{}, {"num_minibatches": 2}], ids=["sync", "streaming"])
def test_an_env_that_always_fails_stops_the_loop_with_its_error_written_once(service, tok, tmp_path, capsys, stream):
    train_tasks = tasks(4)
    factory = FragileEnvs(tokenizer=tok, errors=everything_fails(train_tasks))
    training = service.create_lora_training_client("tiny-random", rank=0, seed=0)
    with pytest.raises(TrinityError) as info:
        train(config(tmp_path, **stream), training, factory, train_tasks)
    assert str(info.value) == (
        "iteration 1: 2 of 2 groups were dropped, more than RLTrainConfig.max_dropped_fraction=0.5 allows; "
        f"the first: Fragile (group 0, env 0) step at turn 0: {DOWN}"
    )
    out = capsys.readouterr().out
    assert out.count("dropped a group") == 1, out  # two groups, one distinct error: written once
    assert f"iteration 1: env Fragile dropped a group: {DOWN} (Fragile (group 0, env 0) step at turn 0;" in out
    assert not (tmp_path / "run" / "metrics.jsonl").read_text().strip()  # no iteration was logged: none trained


def test_below_the_limit_the_loop_trains_on_the_rest_and_counts_every_drop(service, tok, tmp_path, capsys):
    train_tasks = tasks(4)
    # one group of each batch of 2 fails (0.5: not more than the limit), each with its own error
    errors = {
        train_tasks[0].task_id: KeyError("no such tool"),
        train_tasks[2].task_id: ValueError("tool server\nunreachable"),
    }
    factory = FragileEnvs(tokenizer=tok, errors=errors)
    training = service.create_lora_training_client("tiny-random", rank=0, seed=0)
    result = train(config(tmp_path, iterations=4), training, factory, train_tasks)
    assert [m["step"] for m in result.metrics] == [1, 2, 3, 4]
    for m in result.metrics:
        assert m["rollout/dropped_groups"] == 1 and m["rollout/dropped_episodes"] == 2 and m["rollout/episodes"] == 2
        assert m["env/calls"] == 0.0 and m["env/odd"] in (0.0, 0.5, 1.0)  # declared and never reported: 0
    out = capsys.readouterr().out
    # four drops of two distinct errors (the batches cycle): each written once, on one line
    assert out.count("dropped a group") == 2, out
    assert "iteration 1: env Fragile dropped a group: KeyError: 'no such tool'" in out
    assert f"iteration 2: env Fragile dropped a group: {DOWN}" in out


def test_a_limit_of_one_trains_on_through_any_drops(service, tok, tmp_path):
    train_tasks = tasks(2)
    factory = FragileEnvs(tokenizer=tok, errors=everything_fails(train_tasks))
    training = service.create_lora_training_client("tiny-random", rank=0, seed=0)
    result = train(config(tmp_path, max_dropped_fraction=1.0), training, factory, train_tasks)
    assert all(m["rollout/dropped_groups"] == 2 and m["train/substeps"] == 0 for m in result.metrics)
    assert "env/odd" not in result.metrics[0]  # no episode kept: no env metrics at all
    logged = [json.loads(ln) for ln in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["rollout/dropped_groups"] for r in logged] == [2.0, 2.0]


def test_a_held_out_drop_scores_zero_is_counted_and_does_not_stop(service, tok, tmp_path):
    held_out = tasks(4, "eval")
    factory = FragileEnvs(
        tokenizer=tok, errors={t.task_id: ValueError("tool server unreachable") for t in held_out[:3]}
    )
    lines = []
    metrics = evaluate(SamplingClient("tiny-random"), factory, held_out, config(tmp_path), DropNotices(lines.append))
    assert metrics["eval/dropped"] == 3 and metrics["eval/tasks"] == 4
    assert metrics["eval/accuracy"] == pytest.approx(metrics["eval/env/odd"] / 4)  # 3 of 4 score 0
    assert metrics["eval/env/calls"] == 0.0 and metrics["eval/rollout/turns/mean"] == 1.0
    assert lines == [
        f"evaluation: env Fragile dropped a group: {DOWN} (Fragile (group 0, env 0) step at turn 0; "
        "shown once, counted in rollout/dropped_groups)"
    ]


@pytest.mark.parametrize("value", [1.5, -0.1, "half"])
def test_a_bad_limit_is_a_one_line_error_naming_the_field(tmp_path, value):
    with pytest.raises(ConfigError, match=r"^RLTrainConfig\.max_dropped_fraction: "):
        config(tmp_path, max_dropped_fraction=value)
