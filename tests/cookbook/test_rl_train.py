"""The client's RL loop (cookbook/rl/train.py) on the tiny model: advantages against
hand-computed values, KL shaping against a manual reference forward, substeps that use every
datum once, greedy evaluation against a direct decode, checkpoints that resume exactly."""

from __future__ import annotations

import dataclasses
import doctest
import json
import math

import numpy as np
import pytest
import torch

import trinity_like.client as tinker
from cookbook.rl import core as rl_core
from cookbook.rl import train as rl_train
from cookbook.rl.train import (
    Episode,
    RLTrainConfig,
    build_rows,
    group_episodes,
    reference_kl,
    sample_episodes,
    train,
    turn_advantages,
)
from trinity_like.client.sampling import SamplingClient
from trinity_like.envs.dataset import TaskGroupBuilder, build_env_factory
from trinity_like.envs.rollout import RolloutParams
from trinity_like.envs.types import Env, EnvFactory, StepResult, StopCondition
from trinity_like.errors import ConfigError
from trinity_like.explorer.engine import NativeEngine
from trinity_like.explorer.engine import SamplingParams as EngineSampling
from trinity_like.explorer.tasks import ArithmeticParams, arithmetic_tasks
from trinity_like.models.chat import message_tokens, render_prompt
from trinity_like.models.resolve import load_model
from trinity_like.monitor.plot import plot_run

types = tinker.types
NO_SPACE = {"reward_fn": "format", "reward_params": {"pattern": r"\S+"}, "max_tokens": 8}  # varies on a random model


class ThreeTurns(Env):
    """Three actions; the env answers the first two with 'more'. Each turn's reward is the parity
    of the action's first token, so rewards vary by turn and by episode."""

    def __init__(self, tok, task):
        self.tok, self.messages = tok, task.messages()
        self.history = render_prompt(tok, self.messages)
        self.stop, self.turn = StopCondition(max_tokens=5), 0

    def initial_observation(self):
        return list(self.history), self.stop

    def step(self, action):
        self.turn += 1
        reward = float(action[0] % 2)
        if self.turn == 3:
            return StepResult(reward, True)
        reply = {"role": "user", "content": "more"}
        self.history += list(action) + message_tokens(self.tok, self.messages, [reply], action_tokens=action)
        self.messages = self.messages + [{"role": "assistant", "content": self.tok.decode(action)}, reply]
        return StepResult(reward, False, list(self.history), self.stop)


class FirstGetsABonus(TaskGroupBuilder):
    def compute_group_rewards(self, trajectories):
        return [0.25] + [0.0] * (len(trajectories) - 1)


class ThreeTurnEnvs(EnvFactory):
    def __init__(self, *, tokenizer):
        self.tok = tokenizer

    def group_builder(self, task, group_size):
        return FirstGetsABonus(task, group_size, lambda: ThreeTurns(self.tok, task))


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    with tinker.ServiceClient(log_dir=tmp_path_factory.mktemp("client")) as s:
        yield s


@pytest.fixture(scope="module")
def tok(service):
    return SamplingClient("tiny-random").get_tokenizer()


def tasks(split, n):
    return arithmetic_tasks(ArithmeticParams(), split, n)


def config(tmp_path, **overrides):
    values = {
        "log_path": str(tmp_path / "run"),
        "iterations": 2,
        "batch_size": 2,
        "group_size": 4,
        "eval_every": 0,
        "save_every": 0,
        "progress": False,
        "learning_rate": 1e-3,
    }
    return RLTrainConfig(**{**values, **overrides})


def datum_advantages(row):
    return row.datum.loss_fn_inputs["advantages"].to_numpy()


def test_docstring_examples():
    assert doctest.testmod(rl_core).failed == 0 and doctest.testmod(rl_train).failed == 0


# -- advantages -------------------------------------------------------------------------------------
def test_turn_advantages_by_hand():
    rewards = [[1.0, 0.0, 2.0], [0.0, 0.0, 0.0], [0.0, 3.0]]
    # Returns-to-go 3 2 2 | 0 0 0 | 3 3 (0 after its end); turn means 2, 5/3, 2/3.
    per_turn = turn_advantages(rewards, per_turn=True)
    expected = [[1, 1 / 3, 4 / 3], [-2, -5 / 3, -2 / 3], [1, 4 / 3]]
    assert [len(a) for a in per_turn] == [3, 3, 2]
    assert all(a == pytest.approx(e) for a, e in zip(per_turn, expected))
    assert turn_advantages(rewards, per_turn=False) == [[1, 1, 1], [-2, -2, -2], [1, 1]]  # returns 3 0 3, mean 2
    # A reward earned early does not count for later turns when every episode earned it.
    assert turn_advantages([[0.1, 0.0], [0.1, 0.0]], per_turn=True) == [[0.0, 0.0], [0.0, 0.0]]
    # Rewarded at the last turn only, as many turns each: per turn is the default.
    last = [[0.0, 0.0, 1.0], [0.0, 0.0, 0.0], [0.0, 0.0, 0.5]]
    assert turn_advantages(last, per_turn=True) == turn_advantages(last, per_turn=False)


@pytest.mark.parametrize("per_turn", [False, True], ids=["episode", "per_turn"])
def test_three_turn_episodes_give_each_turns_tokens_their_advantage(tok, tmp_path, per_turn):
    builder = ThreeTurnEnvs(tokenizer=tok).group_builder(tasks("train", 1)[0], 4)
    result = sample_episodes(SamplingClient("tiny-random"), [builder], seed=5, params=RolloutParams())
    trajectories = result.groups[0].trajectories
    episodes = group_episodes(result.groups[0])
    rewards = [[float(t.action[0] % 2) for t in traj.transitions] for traj in trajectories]
    rewards[0][-1] += 0.25  # the group reward goes to the last turn
    assert [ep.rewards for ep in episodes] == rewards and all(len(ep.spans) == 3 for ep in episodes)
    assert len({tuple(r) for r in rewards}) > 1  # the group varies (else everything is 0)
    # The oracle, written out: return-to-go (or return) minus the group's mean at that turn.
    G = len(rewards)
    if per_turn:
        to_go = [[sum(r[t:]) for t in range(3)] for r in rewards]
        oracle = [[to_go[i][t] - sum(to_go[j][t] for j in range(G)) / G for t in range(3)] for i in range(G)]
    else:
        oracle = [[sum(r) - sum(map(sum, rewards)) / G] * 3 for r in rewards]
    rows, metrics = build_rows(
        [episodes], config(tmp_path, advantage_per_turn=per_turn, skip_zero_advantage_groups=False)
    )
    assert metrics["train/datums"] == 4 and metrics["train/policy_tokens"] == sum(
        len(t.action) for traj in trajectories for t in traj.transitions
    )
    for row, traj, expected in zip(rows, trajectories, oracle):
        adv = datum_advantages(row)
        target = row.datum.loss_fn_inputs["target_tokens"].to_numpy()
        logprobs = row.datum.loss_fn_inputs["logprobs"].to_numpy()
        want = np.zeros_like(adv)
        for t, transition in enumerate(traj.transitions):  # datum position p predicts token p + 1
            start = len(transition.observation) - 1
            span = slice(start, start + len(transition.action))
            want[span] = expected[t]
            assert target[span].tolist() == transition.action
            assert logprobs[span] == pytest.approx(transition.logprobs, abs=1e-6)
        assert adv == pytest.approx(want, abs=1e-6)  # 0 on the prompt and the env's "more"


def test_groups_with_equal_rewards_are_skipped_and_counted(tmp_path):
    same = [Episode([1, 2, 3], [0.0, -1.0, -1.0], [(1, 3)], [1.0]) for _ in range(3)]
    varied = [Episode([1, 2, 3], [0.0, -1.0, -1.0], [(1, 3)], [r]) for r in (0.0, 1.0, 1.0)]
    rows, metrics = build_rows([same, varied], config(tmp_path))
    assert len(rows) == 3 and metrics["train/skipped_groups"] == 1
    for row, a in zip(rows, (-2 / 3, 1 / 3, 1 / 3)):
        assert datum_advantages(row) == pytest.approx([a, a])
    rows, metrics = build_rows([same, varied], config(tmp_path, skip_zero_advantage_groups=False))
    assert len(rows) == 6 and metrics["train/skipped_groups"] == 0
    assert all(not datum_advantages(r).any() for r in rows[:3])


# -- KL as reward shaping ------------------------------------------------------------------------------
def test_kl_shaping_uses_the_base_models_logprobs_and_enters_the_rewards_only(tok, tmp_path):
    base, _ = load_model("tiny-random")
    moved = {
        k: v + 0.02 * torch.randn(v.shape, generator=torch.Generator().manual_seed(1)) if v.is_floating_point() else v
        for k, v in base.state_dict().items()
    }
    policy = SamplingClient("tiny-random", weights=moved)
    builder = ThreeTurnEnvs(tokenizer=tok).group_builder(tasks("train", 1)[0], 4)
    episodes = group_episodes(sample_episodes(policy, [builder], seed=2, params=RolloutParams()).groups[0])
    metrics = reference_kl(SamplingClient("tiny-random"), episodes)
    k1, k3 = [], []
    for ep in episodes:
        with torch.no_grad():  # the reference by hand: one forward of the base model
            logits = base(torch.tensor([ep.tokens_T])).logits[0, :-1]
        ref_T = [0.0] + torch.log_softmax(logits, -1).gather(1, torch.tensor(ep.tokens_T[1:])[:, None])[:, 0].tolist()
        for (start, end), kl in zip(ep.spans, ep.kl):
            diff = [ep.logprobs_T[j] - ref_T[j] for j in range(start, end)]
            assert kl == pytest.approx(sum(diff), abs=1e-3)
            k1 += diff
            k3 += [math.exp(-d) - 1 + d for d in diff]
    assert metrics["kl/ref_k1"] == pytest.approx(np.mean(k1), abs=1e-4) and metrics["kl/ref_k1"] > 0.01
    assert metrics["kl/ref_k3"] == pytest.approx(np.mean(k3), abs=1e-4) and metrics["kl/ref_k3"] > 0
    beta = 0.5
    rows, _ = build_rows([episodes], config(tmp_path, kl_penalty_coef=beta, skip_zero_advantage_groups=False))
    shaped = [sum(ep.rewards) - beta * sum(ep.kl) for ep in episodes]
    for row, ep, value in zip(rows, episodes, shaped):
        assert set(row.datum.loss_fn_inputs) == {"target_tokens", "logprobs", "advantages"}  # nothing of ref
        policy_adv = datum_advantages(row)[ep.spans[0][0] - 1]
        assert policy_adv == pytest.approx(value - np.mean(shaped), abs=1e-5)


def test_the_loop_logs_kl_to_the_base_and_each_stage(service, tmp_path):
    training = service.create_lora_training_client("tiny-random", rank=0, seed=0)
    factory = build_env_factory("arithmetic", NO_SPACE, tokenizer=training.get_tokenizer())
    result = train(config(tmp_path, kl_penalty_coef=0.1, learning_rate=1e-2), training, factory, tasks("train", 8))
    first, second = result.metrics
    assert abs(first["kl/ref_k1"]) < 1e-4 and first["kl/ref_k3"] < 1e-6  # the first batch: the policy is the base
    assert second["kl/ref_k1"] > 1e-3 and second["kl/ref_k3"] > 0  # after a step at lr 1e-2 it is not
    for m in result.metrics:
        assert all(m[f"time/{stage}"] > 0 for stage in ("rollout", "reference", "update", "step"))
        assert math.isfinite(m["loss"]) and m["throughput/tokens_per_s"] > 0 and m["entropy"] > 0
    assert plot_run(tmp_path / "run").stat().st_size > 0  # a recipe run's metrics shape: `trinity-like plot` draws it
    plain = train(
        config(tmp_path / "plain"),
        service.create_lora_training_client("tiny-random", rank=0, seed=0),
        factory,
        tasks("train", 8),
    )
    assert not any(k.startswith("kl/ref") or k == "time/reference" for m in plain.metrics for k in m)


# -- substeps, ppo ---------------------------------------------------------------------------------------
class Counting:
    """The real training client, recording what reaches forward_backward and optim_step."""

    def __init__(self, client):
        self.client, self.batches, self.steps = client, [], 0

    def __getattr__(self, name):
        return getattr(self.client, name)

    def forward_backward(self, data, loss_fn, loss_fn_config=None):
        self.batches.append(list(data))
        return self.client.forward_backward(data, loss_fn, loss_fn_config)

    def optim_step(self, params):
        self.steps += 1
        return self.client.optim_step(params)


@pytest.mark.parametrize("substeps, sizes", [(1, [8]), (3, [2, 3, 3]), (8, [1] * 8)])
def test_substeps_use_every_datum_of_an_iteration_exactly_once(service, tmp_path, substeps, sizes):
    training = Counting(service.create_lora_training_client("tiny-random", rank=0, seed=0))
    factory = build_env_factory("arithmetic", NO_SPACE, tokenizer=training.get_tokenizer())
    result = train(
        config(tmp_path, num_substeps=substeps, skip_zero_advantage_groups=False), training, factory, tasks("train", 8)
    )
    assert training.steps == 2 * len(sizes) and len(training.batches) == 2 * len(sizes)
    for it, m in enumerate(result.metrics):
        batches = training.batches[it * len(sizes) : (it + 1) * len(sizes)]
        assert [len(b) for b in batches] == sizes
        used = [id(d) for b in batches for d in b]
        assert len(set(used)) == len(used) == m["rollout/episodes"] == m["train/datums"] == 8
        assert m["train/substeps"] == len(sizes)
    a, b = (training.batches[i * len(sizes)][0] for i in range(2))
    assert a.model_input.to_ints() != b.model_input.to_ints()  # each iteration trains on its own episodes


def test_ppo_clip_fraction_counts_policy_tokens_beyond_their_bound(service, tmp_path):
    row = rl_core._Row(
        datum=None,
        policy_P=np.array([0, 2, 3, 4]),
        sampler_P=np.log([0.5, 0.5, 0.5, 0.5]),
        advantages_P=np.array([1.0, 1.0, -1.0, -1.0]),
    )
    learner = np.log([0.9, 0.7, 0.55, 0.3, 0.45])  # ratios 1.8, 1.1 | 0.6, 0.9 at the policy positions
    assert rl_core._clipped(row, learner, config(tmp_path, loss_fn="ppo")) == 2  # 1.8 > 1.2 (A>0), 0.6 < 0.8 (A<0)
    assert (
        rl_core._clipped(row, learner, config(tmp_path, loss_fn="ppo", loss_fn_config={"clip_high_threshold": 2.0}))
        == 1
    )
    training = service.create_lora_training_client("tiny-random", rank=0, seed=0)
    factory = build_env_factory("arithmetic", NO_SPACE, tokenizer=training.get_tokenizer())
    result = train(
        config(tmp_path, loss_fn="ppo", num_substeps=2, learning_rate=5e-2, iterations=1),
        training,
        factory,
        tasks("train", 8),
    )
    assert 0 < result.metrics[0]["train/clip_frac"] <= 1  # the second minibatch ran on moved weights


# -- evaluation, checkpoints ------------------------------------------------------------------------------
def test_evaluation_is_greedy_accuracy_as_a_direct_decode_finds_it(service, tmp_path, tok):
    training = service.create_lora_training_client("tiny-random", rank=0, seed=0)
    factory = build_env_factory("arithmetic", NO_SPACE, tokenizer=tok)
    held_out = tasks("eval", 8)
    metrics = rl_train.evaluate(training.save_weights_and_get_sampling_client(), factory, held_out, config(tmp_path))
    model, _ = load_model("tiny-random")
    prompts = [render_prompt(tok, t.messages()) for t in held_out]
    answers = NativeEngine(model, tok).generate(prompts, EngineSampling(max_new_tokens=8, greedy=True))
    texts = [tok.decode(a[0].token_ids, skip_special_tokens=True).strip() for a in answers]
    right = [float(bool(t) and not any(c.isspace() for c in t)) for t in texts]
    assert 0 < sum(right) < len(right)  # a score that can be wrong both ways
    assert metrics["eval/accuracy"] == pytest.approx(sum(right) / len(right))
    assert metrics["eval/tasks"] == 8 and metrics["eval/accuracy_stderr"] > 0


@pytest.mark.parametrize(
    "every, at_start, steps",
    [(None, True, [0, 3]), (2, True, [0, 2, 3]), (2, False, [2, 3]), (0, True, [])],
)
def test_evaluation_cadence_means_what_a_recipes_does(service, tmp_path, tok, capsys, every, at_start, steps):
    """eval_every as monitor.eval_interval: N (and the start and the end), None (start and end only), 0 (never,
    said in one line); a held-out system prompt that differs from the training one is a warning line."""
    factory = build_env_factory("arithmetic", NO_SPACE, tokenizer=tok)
    training = service.create_lora_training_client("tiny-random", rank=0, seed=0)
    held_out = [dataclasses.replace(t, system_prompt="Be brief.") for t in tasks("eval", 2)]
    run = config(tmp_path, iterations=3, batch_size=2, group_size=2, eval_every=every, eval_at_start=at_start)
    result = train(run, training, factory, tasks("train", 6), held_out)
    assert [e["step"] for e in result.evals] == steps
    out = capsys.readouterr().out
    assert ("eval_every=0: the held-out tasks are never evaluated" in out) == (every == 0)
    assert "warning: the held-out tasks' system prompt 'Be brief.' differs from the training tasks' 'You are" in out


def logprobs_of(training, datum):
    return training.forward([datum], "cross_entropy").result().loss_fn_outputs[0]["logprobs"].to_numpy()


def test_checkpoints_resume_the_iteration_counter_and_the_same_training(service, tmp_path, tok):
    factory = build_env_factory("arithmetic", NO_SPACE, tokenizer=tok)
    ids = tok.encode("What is 2 + 3? 5")
    probe = types.Datum(
        model_input=types.ModelInput.from_ints(ids[:-1]),
        loss_fn_inputs={"target_tokens": ids[1:], "weights": [1.0] * (len(ids) - 1)},
    )
    straight = service.create_lora_training_client("tiny-random", rank=0, seed=0)
    every = {"eval_every": 2, "save_every": 2}
    train(config(tmp_path / "straight", iterations=3, **every), straight, factory, tasks("train", 8), tasks("eval", 4))

    first = service.create_lora_training_client("tiny-random", rank=0, seed=0)
    run = config(tmp_path / "split", iterations=3, **every)
    train(run, first, factory, tasks("train", 8), tasks("eval", 4))
    log_path = tmp_path / "split" / "run"
    saved = [json.loads(line) for line in (log_path / rl_train.CHECKPOINTS).read_text().splitlines()]
    assert [s["iteration"] for s in saved] == [2, 3]  # every 2 and at the end
    # as if it died while appending the save of 3: a torn last line
    (log_path / rl_train.CHECKPOINTS).write_text(json.dumps(saved[0]) + "\n" + '{"iteration": 3, "pa')

    resumed = service.create_lora_training_client("tiny-random", rank=0, seed=0)
    result = train(run, resumed, factory, tasks("train", 8), tasks("eval", 4))
    assert result.start_iteration == 2 and [m["step"] for m in result.metrics] == [3]
    steps = [json.loads(line)["step"] for line in (log_path / "metrics.jsonl").read_text().splitlines()]
    assert steps == [0, 1, 2, 3]  # the dead run's iteration 3 was dropped, then logged again
    lines = (log_path / rl_train.CHECKPOINTS).read_text().splitlines()
    assert [json.loads(line)["iteration"] for line in lines] == [2, 3]  # the torn line was cut, not appended to
    np.testing.assert_array_equal(logprobs_of(resumed, probe), logprobs_of(straight, probe))
    assert not np.array_equal(
        logprobs_of(resumed, probe),
        logprobs_of(service.create_lora_training_client("tiny-random", rank=0, seed=0), probe),
    )  # it did train
    again = train(
        run,
        service.create_lora_training_client("tiny-random", rank=0, seed=0),
        factory,
        tasks("train", 8),
        tasks("eval", 4),
    )
    assert again.start_iteration == 3 and again.metrics == []  # finished: nothing left to do


# -- configuration -------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "override, message",
    [
        ({"num_substeps": 0}, r"^RLTrainConfig.num_substeps: must be >= 1, got 0$"),
        ({"loss_fn": "cross_entropy"}, r"^RLTrainConfig.loss_fn: must be one of importance_sampling, ppo, cispo, dro"),
        ({"loss_fn": "ppo", "loss_fn_config": {"clip_hi": 1.3}}, r"^RLTrainConfig.loss_fn_config: 'ppo' takes"),
        ({"kl_penalty_coef": -0.1}, r"^RLTrainConfig.kl_penalty_coef: must be >= 0"),
        ({"batch_size": "8"}, r"^RLTrainConfig.batch_size: expected int, got '8'$"),
        ({"advantage_per_turn": 1}, r"^RLTrainConfig.advantage_per_turn: expected bool, got 1$"),
        (
            {"eval_every": -1},
            r"^RLTrainConfig.eval_every: must be None \(at the start and the end only\) or >= 0 \(0: never\), got -1$",
        ),
        ({"eval_every": 2.5}, r"^RLTrainConfig.eval_every: must be None .* or >= 0 \(0: never\), got 2.5$"),
        ({"log_path": ""}, r"^RLTrainConfig.log_path: must name a folder"),
    ],
)
def test_bad_config_is_a_one_line_error_naming_the_key(tmp_path, override, message):
    with pytest.raises(ConfigError, match=message):
        config(tmp_path, **override)
