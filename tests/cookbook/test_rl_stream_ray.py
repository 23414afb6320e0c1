"""The stream (cookbook/rl/stream.py) on the Ray backend: two sampler actors fed
chunks concurrently while the learner actor trains; every datum trained once, staleness as
configured. Ray is started for this module and shut down after it."""

from __future__ import annotations

from collections import Counter

import pytest

import trinity_like.client as tinker
from cookbook.rl.train import RLTrainConfig, train
from trinity_like.client.ray import RayClientConfig
from trinity_like.envs.dataset import build_env_factory
from trinity_like.explorer.tasks import ArithmeticParams, arithmetic_tasks
from trinity_like.models.chat import render_prompt

NO_SPACE = {"reward_fn": "format", "reward_params": {"pattern": r"\S+"}, "max_tokens": 8}  # varies on a random model


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    import ray

    ray.init(address="local", num_cpus=4, include_dashboard=False, log_to_driver=False)
    try:
        with tinker.ServiceClient(
            backend="ray",
            log_dir=tmp_path_factory.mktemp("ray"),
            ray=RayClientConfig.from_dict({"samplers": {"count": 2, "CPU": 1}}),
        ) as s:
            yield s
    finally:
        ray.shutdown()


class Recording:
    """The Ray training client, recording each forward_backward's datums with the steps taken before it."""

    def __init__(self, client):
        self.client, self.batches, self.steps = client, [], 0

    def __getattr__(self, name):
        return getattr(self.client, name)

    def forward_backward(self, data, loss_fn, loss_fn_config=None):
        self.batches.append((self.steps, list(data)))
        return self.client.forward_backward(data, loss_fn, loss_fn_config)

    def optim_step(self, params):
        self.steps += 1
        return self.client.optim_step(params)


def test_k1_streaming_on_ray_trains_every_datum_once(service, tmp_path):
    training = Recording(service.create_lora_training_client("tiny-random", rank=0, seed=0))
    tok = training.get_tokenizer()
    factory = build_env_factory("arithmetic", NO_SPACE, tokenizer=tok)
    tasks = arithmetic_tasks(ArithmeticParams(), "train", 8)
    config = RLTrainConfig(
        log_path=str(tmp_path / "run"),
        iterations=3,
        batch_size=4,
        group_size=2,
        eval_every=0,
        save_every=0,
        progress=False,
        learning_rate=1e-3,
        num_minibatches=2,
        max_steps_off_policy=1,
        loss_fn="ppo",
        skip_zero_advantage_groups=False,
    )
    result = train(config, training, factory, tasks)
    # samplers run at most one iteration ahead; whether they do depends on who is faster
    staleness = [m["async/staleness_max"] for m in result.metrics]
    assert staleness[0] == 0.0 and set(staleness) <= {0.0, 1.0}, staleness
    assert all(m["train/datums"] == 8 and m["train/substeps"] == 1 for m in result.metrics)
    prompts = {t.task_id: render_prompt(tok, t.messages()) for t in tasks}
    everything = Counter()
    for it in range(3):
        data = [d for steps, batch in training.batches if steps == it for d in batch]
        trained = Counter(next(k for k, p in prompts.items() if d.model_input.to_ints()[: len(p)] == p) for d in data)
        # the learner takes finished chunks in arrival order (the stream's rule), so with two samplers
        # an iteration may hold a chunk of the next batch -- even the same task's group from the next
        # epoch beside its first one: each group is trained whole, 8 datums a step
        assert sum(trained.values()) == 8 and all(n % 2 == 0 for n in trained.values()), (it, trained)
        everything += trained
    # 3 iterations x 4 groups x 2 episodes: every task of the 8 once, and 4 of them (the second
    # epoch's first batch, whose order is the dataset's) a second time -- unless a straggler chunk
    # was overtaken by two later ones and dropped as stale (the stream's rule, counted in
    # async/discarded_stale): its groups are then not trained and a later chunk's are in their place
    discarded = int(sum(m["async/discarded_stale"] for m in result.metrics))
    if discarded == 0:
        assert set(everything) == {t.task_id for t in tasks}, everything
        assert sorted(everything.values()) == [2] * 4 + [4] * 4, everything
    else:
        assert discarded % 2 == 0, discarded  # whole chunks of 2 groups
        assert len(everything) >= len(tasks) - discarded, (discarded, everything)
