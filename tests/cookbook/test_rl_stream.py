"""Streaming minibatches and off-by-K sampling in the client's RL loop (cookbook/rl/stream.py),
on the tiny model: every datum trained exactly once, the first minibatch trained while the
others are still being sampled, K = 0 exactly the synchronous loop (checked against a loop
written out here), K = 1 training on the weights one iteration old (the sampler's logprobs
checked against each version's own), a straggler beyond K dropped and counted."""

from __future__ import annotations

import doctest
import threading
from collections import Counter

import numpy as np
import pytest

import trinity_like.client as tinker
from cookbook.rl import stream as rl_stream
from cookbook.rl.stream import interval_union, overlap_fraction
from cookbook.rl.train import (
    RLTrainConfig,
    build_rows,
    group_episodes,
    sample_episodes,
    train,
)
from trinity_like.client.sampling import SamplingClient
from trinity_like.envs.dataset import TaskEnvDataset, TaskGroupBuilder
from trinity_like.envs.types import Env, EnvFactory, StepResult, StopCondition
from trinity_like.errors import ConfigError, TrinityError
from trinity_like.explorer.engine import sample_seed
from trinity_like.explorer.tasks import ArithmeticParams, arithmetic_tasks
from trinity_like.models.chat import render_prompt

types = tinker.types
WAIT_S = 60.0  # a gate that is never opened fails the test after this long instead of hanging it


class Parity(Env):
    """One action; reward 1 if its first token is odd (varies within a group on a random model).
    ``gate``: the step waits for it first, and records whether it opened in time."""

    def __init__(self, tok, task, gate=None, opened=None):
        self.prompt, self.gate, self.opened = render_prompt(tok, task.messages()), gate, opened

    def initial_observation(self):
        return list(self.prompt), StopCondition(max_tokens=4)

    def step(self, action):
        if self.gate is not None:
            self.opened.append(self.gate.wait(WAIT_S))
        return StepResult(float(action[0] % 2), True)


class ParityEnvs(EnvFactory):
    """Parity envs; the first ``gated_envs`` envs made of each ``gated`` task (its first group)
    wait on ``gate``."""

    def __init__(self, *, tokenizer, gate=None, gated=(), gated_envs=2):
        self.tok, self.gate, self.opened = tokenizer, gate, []
        self.left = {task_id: gated_envs for task_id in gated}

    def group_builder(self, task, group_size):
        return TaskGroupBuilder(task, group_size, lambda: self.make_env(task))

    def make_env(self, task):
        gated = self.left.get(task.task_id, 0) > 0
        if gated:
            self.left[task.task_id] -= 1
        return Parity(self.tok, task, self.gate if gated else None, self.opened)


class Recording:
    """The real training client; records each forward_backward's datums and the calls' order,
    opens ``on_forward`` at the first forward_backward and ``on_step[n]`` after optim step n."""

    def __init__(self, client, on_forward=None, on_step=None):
        self.client, self.on_forward, self.on_step = client, on_forward, dict(on_step or {})
        self.batches, self.calls, self.steps, self.samplers = [], [], 0, []

    def __getattr__(self, name):
        return getattr(self.client, name)

    def forward_backward(self, data, loss_fn, loss_fn_config=None):
        self.batches.append((self.steps, list(data)))
        self.calls.append("fwd")
        if self.on_forward is not None:
            self.on_forward.set()
        return self.client.forward_backward(data, loss_fn, loss_fn_config)

    def optim_step(self, params):
        self.calls.append("opt")
        future = self.client.optim_step(params)
        self.steps += 1
        if self.steps in self.on_step:
            future.result()  # the step is applied before the gate opens
            self.on_step[self.steps].set()
        return future

    def save_weights_and_get_sampling_client(self, *args, **kwargs):
        sampler = self.client.save_weights_and_get_sampling_client(*args, **kwargs)
        self.samplers.append(sampler)
        return sampler


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    with tinker.ServiceClient(log_dir=tmp_path_factory.mktemp("client")) as s:
        yield s


@pytest.fixture(scope="module")
def tok():
    return SamplingClient("tiny-random").get_tokenizer()


def tasks(n, split="train"):
    return arithmetic_tasks(ArithmeticParams(), split, n)


def config(tmp_path, **overrides):
    values = {
        "log_path": str(tmp_path / "run"),
        "iterations": 2,
        "batch_size": 4,
        "group_size": 2,
        "eval_every": 0,
        "save_every": 0,
        "progress": False,
        "learning_rate": 1e-2,
        "skip_zero_advantage_groups": False,
    }
    return RLTrainConfig(**{**values, **overrides})


def probe(tok):
    ids = tok.encode("What is 2 + 3? 5")
    return types.Datum(
        model_input=types.ModelInput.from_ints(ids[:-1]),
        loss_fn_inputs={"target_tokens": ids[1:], "weights": [1.0] * (len(ids) - 1)},
    )


def task_of(datum, candidates, tok):
    """The task whose prompt the datum's tokens start with."""
    ids = datum.model_input.to_ints()
    hits = [t.task_id for t in candidates if ids[: len(p := render_prompt(tok, t.messages()))] == p]
    assert len(hits) == 1, hits
    return hits[0]


def logprobs_of(training, datum):
    return training.forward([datum], "cross_entropy").result().loss_fn_outputs[0]["logprobs"].to_numpy()


def test_docstring_examples():
    assert doctest.testmod(rl_stream).failed == 0


def test_overlap_by_hand():
    assert interval_union([(0.0, 1.0), (0.5, 2.5), (3.0, 4.0), (3.5, 3.75)]) == pytest.approx(3.5)
    assert interval_union([]) == 0.0
    # 3.5 s of sampling, the learner waited 0.7 s of it: 80 % hidden.
    assert overlap_fraction(3.5, 0.7) == pytest.approx(0.8)


# -- streaming, on-policy ------------------------------------------------------------------------------
def test_streaming_trains_every_datum_of_an_iteration_exactly_once(service, tmp_path, tok):
    training = Recording(service.create_lora_training_client("tiny-random", rank=0, seed=0))
    train_tasks = tasks(8)
    run = config(tmp_path, num_substeps=2, num_minibatches=2)  # 4 groups: a minibatch of one group each
    result = train(run, training, ParityEnvs(tokenizer=tok), train_tasks)
    assert training.calls == ["fwd", "fwd", "opt"] * 4  # two substeps of two minibatches, per iteration
    seen = [id(d) for _, batch in training.batches for d in batch]
    assert len(seen) == len(set(seen)) == 2 * 4 * 2  # none twice
    for it, metrics in enumerate(result.metrics):
        batches = training.batches[4 * it : 4 * it + 4]
        trained = Counter(task_of(d, train_tasks, tok) for _, batch in batches for d in batch)
        expected = Counter({t.task_id: 2 for t in train_tasks[4 * it : 4 * it + 4]})
        assert trained == expected  # the iteration's episodes: each task's group, nothing else
        assert sum(len(b) for _, b in batches) == metrics["train/datums"] == metrics["rollout/episodes"] == 8
        assert [steps for steps, _ in batches] == [2 * it, 2 * it, 2 * it + 1, 2 * it + 1]  # substep order
        assert metrics["async/staleness_max"] == 0 and metrics["async/discarded_stale"] == 0
        assert metrics["train/substeps"] == 2 and 0 <= metrics["async/overlap_fraction"] <= 1


def test_the_learner_starts_on_the_first_minibatch_while_the_second_is_sampled(service, tmp_path, tok):
    first_forward = threading.Event()
    training = Recording(service.create_lora_training_client("tiny-random", rank=0, seed=0), on_forward=first_forward)
    train_tasks = tasks(2)
    # The second minibatch's episodes cannot finish until a forward_backward has started: a loop
    # that waited for the whole batch would wait here until the gate gives up.
    factory = ParityEnvs(tokenizer=tok, gate=first_forward, gated=[train_tasks[1].task_id])
    result = train(config(tmp_path, iterations=1, batch_size=2, num_minibatches=2), training, factory, train_tasks)
    assert factory.opened == [True, True]  # both episodes of the second group waited, and were let through
    assert training.calls == ["fwd", "fwd", "opt"]
    assert result.metrics[0]["train/datums"] == 4


def test_one_chunk_streaming_is_the_synchronous_loop(service, tmp_path, tok):
    """One minibatch per iteration on the stream samples the same episodes (same seeds) and
    takes the same steps as the synchronous loop: the weights agree bit for bit."""
    factory = ParityEnvs(tokenizer=tok)
    sync = service.create_lora_training_client("tiny-random", rank=0, seed=0)
    streamed = service.create_lora_training_client("tiny-random", rank=0, seed=0)
    a = train(config(tmp_path / "sync", iterations=3), sync, factory, tasks(8))
    b = train(config(tmp_path / "stream", iterations=3, num_minibatches=1), streamed, factory, tasks(8))
    np.testing.assert_array_equal(logprobs_of(sync, probe(tok)), logprobs_of(streamed, probe(tok)))
    for x, y in zip(a.metrics, b.metrics, strict=True):
        for key in ("reward/mean", "reward/std", "train/datums", "loss/sum", "rollout/episodes"):
            assert x[key] == pytest.approx(y[key], rel=1e-6), key


# -- K = 0 is the synchronous loop --------------------------------------------------------------------------
def test_k0_is_the_synchronous_loop_written_out(service, tmp_path, tok):
    factory = ParityEnvs(tokenizer=tok)
    run = config(tmp_path, iterations=3, max_steps_off_policy=0, loss_fn="ppo")
    looped = service.create_lora_training_client("tiny-random", rank=0, seed=0)
    result = train(run, looped, factory, tasks(8))

    # The loop by hand: sample the batch with the current weights, centre rewards, one step.
    by_hand = service.create_lora_training_client("tiny-random", rank=0, seed=0)
    dataset = TaskEnvDataset(tasks(8), factory, batch_size=4, group_size=2)
    sampler = by_hand.save_weights_and_get_sampling_client()
    rewards = []
    for it in (1, 2, 3):
        rollout = sample_episodes(
            sampler, dataset.get_batch((it - 1) % len(dataset)), seed=sample_seed(0, it, 0), params=run.rollout()
        )
        groups = [group_episodes(g) for g in rollout.groups]
        rows, _ = build_rows(groups, run)
        by_hand.forward_backward([r.datum for r in rows], "ppo").result()
        by_hand.optim_step(run.adam()).result()
        sampler = by_hand.save_weights_and_get_sampling_client()
        rewards.append(rollout.metrics["reward/mean"])
    np.testing.assert_array_equal(logprobs_of(looped, probe(tok)), logprobs_of(by_hand, probe(tok)))
    assert [m["reward/mean"] for m in result.metrics] == rewards
    assert not any(key.startswith("async/") for m in result.metrics for key in m)  # not the stream


# -- K >= 1 ---------------------------------------------------------------------------------------------------
def sampled_logprobs(sampler, datum):
    """``sampler``'s own logprobs of the datum's targets (a full forward), where the datum has the sampler's."""
    tokens = datum.model_input.to_ints() + [int(datum.loss_fn_inputs["target_tokens"].to_numpy()[-1])]
    full = np.asarray(sampler.compute_logprobs(types.ModelInput.from_ints(tokens)).result()[1:], dtype=np.float64)
    stored = datum.loss_fn_inputs["logprobs"].to_numpy()
    policy = stored != 0
    return full[policy], stored[policy]


def test_k1_trains_on_samples_of_the_weights_one_iteration_old(service, tmp_path, tok):
    training = Recording(service.create_lora_training_client("tiny-random", rank=0, seed=0))
    run = config(
        tmp_path, iterations=3, batch_size=2, group_size=8, max_steps_off_policy=1, loss_fn="ppo", learning_rate=5e-2
    )
    result = train(run, training, ParityEnvs(tokenizer=tok), tasks(8))
    assert result.metrics[0]["train/advantage_abs_mean"] > 0  # iteration 1 moved the weights
    assert [m["async/staleness_max"] for m in result.metrics] == [0.0, 1.0, 1.0]
    assert result.metrics[1]["async/staleness_mean"] == 1.0 and result.metrics[1]["async/overlap_fraction"] > 0
    assert all(m["async/discarded_stale"] == 0 for m in result.metrics)
    v0, v1 = training.samplers[0], training.samplers[1]  # the weights before, and after, iteration 1
    ((_, batch),) = [b for b in training.batches if b[0] == 1]  # iteration 2: the learner has taken 1 step
    for datum in batch:
        old, stored = sampled_logprobs(v0, datum)
        new, _ = sampled_logprobs(v1, datum)
        np.testing.assert_allclose(stored, old, atol=1e-4)  # sampled by the weights of version 0 ...
        assert np.abs(stored - new).max() > 1e-2  # ... not by the learner's current ones


def test_a_straggler_beyond_k_is_dropped_with_a_warning_and_counted(service, tmp_path, tok, capsys):
    third_step = threading.Event()
    training = Recording(service.create_lora_training_client("tiny-random", rank=0, seed=0), on_step={3: third_step})
    train_tasks = tasks(8)
    # Iteration 1's batch (tasks 0 and 1) cannot finish before the learner's third step: by then
    # it is 3 steps old, beyond K = 1, and the learner has trained on later batches meanwhile.
    factory = ParityEnvs(tokenizer=tok, gate=third_step, gated=[train_tasks[0].task_id])
    run = config(tmp_path, iterations=5, batch_size=2, max_steps_off_policy=1)
    result = train(run, training, factory, train_tasks)
    assert factory.opened == [True, True]
    dropped = [m["async/discarded_stale"] for m in result.metrics]
    assert sum(dropped) == 2 and dropped[:3] == [0, 0, 0]  # both groups of the straggler, after step 3
    assert all(m["async/staleness_max"] <= 1 for m in result.metrics)
    assert all(m["train/datums"] == 4 for m in result.metrics)  # each iteration still trained a full batch
    assert "dropped 2 groups sampled with the weights of iteration 0" in capsys.readouterr().out
    early = {task_of(d, train_tasks, tok) for steps, batch in training.batches if steps < 3 for d in batch}
    assert early == {t.task_id for t in train_tasks[2:8]}  # iterations 1-3 trained batches 2-4


def test_async_run_resumes_from_its_checkpoint(service, tmp_path, tok):
    run = config(tmp_path, iterations=3, batch_size=2, max_steps_off_policy=1, save_every=2)
    train(run, service.create_lora_training_client("tiny-random", rank=0, seed=0), ParityEnvs(tokenizer=tok), tasks(8))
    again = config(tmp_path, iterations=4, batch_size=2, max_steps_off_policy=1, save_every=2)
    result = train(
        again, service.create_lora_training_client("tiny-random", rank=0, seed=0), ParityEnvs(tokenizer=tok), tasks(8)
    )
    assert result.start_iteration == 3 and [m["step"] for m in result.metrics] == [4]
    assert result.metrics[0]["async/staleness_max"] == 0  # the samplers start again from the resumed weights


class Broken(Parity):
    def step(self, action):
        return "not a StepResult"


class BrokenEnvs(EnvFactory):
    def __init__(self, *, tokenizer):
        self.tok = tokenizer

    def group_builder(self, task, group_size):
        return TaskGroupBuilder(task, group_size, lambda: Broken(self.tok, task))


class NoBuilder(EnvFactory):
    def __init__(self, *, tokenizer, after):
        self.tok, self.after = tokenizer, after

    def group_builder(self, task, group_size):
        if task.task_id == self.after:
            raise ValueError(f"no env for {task.task_id}")
        return TaskGroupBuilder(task, group_size, lambda: Parity(self.tok, task))


def test_a_factory_that_raises_stops_the_run_with_its_error(service, tmp_path, tok):
    training = service.create_lora_training_client("tiny-random", rank=0, seed=0)
    bad = tasks(8)[5]  # in iteration 2's batch: the samplers meet it while iteration 1 trains
    with pytest.raises(ValueError, match=f"^no env for {bad.task_id}$"):
        train(
            config(tmp_path, iterations=3, max_steps_off_policy=1),
            training,
            NoBuilder(tokenizer=tok, after=bad.task_id),
            tasks(8),
        )


@pytest.mark.parametrize("stream", [{"max_steps_off_policy": 2}, {"num_minibatches": 2}], ids=["k2", "streaming"])
def test_an_env_that_breaks_its_contract_stops_the_run_with_its_error(service, tmp_path, tok, stream):
    training = service.create_lora_training_client("tiny-random", rank=0, seed=0)
    with pytest.raises(TrinityError, match=r"^Broken \(group 0, env 0\): step\(\) must return a StepResult"):
        train(config(tmp_path, **stream), training, BrokenEnvs(tokenizer=tok), tasks(8))


def test_kl_shaping_runs_beside_the_samplers(service, tmp_path, tok):
    run = config(tmp_path, iterations=2, max_steps_off_policy=1, num_minibatches=2, kl_penalty_coef=0.1)
    result = train(
        run, service.create_lora_training_client("tiny-random", rank=0, seed=0), ParityEnvs(tokenizer=tok), tasks(8)
    )
    first, second = result.metrics
    assert abs(first["kl/ref_k1"]) < 1e-4  # sampled by the base weights: the reference itself
    assert second["kl/ref_k1"] == pytest.approx(0.0, abs=1e-4)  # K = 1: iteration 2's samples are version 0's too
    assert second["async/staleness_max"] == 1


@pytest.mark.parametrize(
    "override, message",
    [
        ({"num_minibatches": -1}, r"^RLTrainConfig.num_minibatches: must be >= 0 \(0: no streaming\), got -1$"),
        ({"max_steps_off_policy": -2}, r"^RLTrainConfig.max_steps_off_policy: must be >= 0 \(0: on-policy\), got -2$"),
        (
            {"num_minibatches": 3, "num_substeps": 2},
            r"^RLTrainConfig.batch_size: must be >= num_substeps \* num_minibatches = 6 \(a group per minibatch\), got 4$",
        ),
        ({"loss_fn": "tis", "loss_fn_config": {"tis_cap": 0.0}}, r"^RLTrainConfig.loss_fn_config"),
    ],
)
def test_bad_stream_config_is_a_one_line_error(tmp_path, override, message):
    with pytest.raises(ConfigError, match=message):
        config(tmp_path, **override)
