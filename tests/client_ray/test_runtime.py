"""The Ray runtime of the client: placement from a config, backpressure with a slow sampler
and with a slow learner, and configuration errors.

The slow parts are the config's test-only delays (``sampler_delay_s``: each sampling request
sleeps first; ``learner_delay_s``: each forward_backward does): real actors, real waits.
"""

from __future__ import annotations

import time

import pytest
from ray.util import placement_group_table

import trinity_like.client as tinker
from trinity_like.client.ray import Bundle, RayClientConfig, wait_all
from trinity_like.errors import ConfigError, TrinityError

types = tinker.types
SAMPLE_DELAY, LEARN_DELAY = 0.4, 2.0


@pytest.fixture(scope="module")
def slow(ray_here, tmp_path_factory):
    """Two samplers taking at most one request each at a time, both slowed, and a slowed learner."""
    config = RayClientConfig.from_dict(
        {
            "learner": {"CPU": 1},
            "samplers": {"count": 2, "CPU": 1},
            "max_in_flight": 1,
            "sampler_delay_s": SAMPLE_DELAY,
            "learner_delay_s": LEARN_DELAY,
        }
    )
    with tinker.ServiceClient(backend="ray", ray=config, log_dir=tmp_path_factory.mktemp("slow")) as service:
        training = service.create_lora_training_client("tiny-random", rank=0, seed=0)
        yield service, training
        training.close()


def done(future) -> bool:
    try:
        future.result(timeout=0)
    except TimeoutError:
        return False
    return True


def datum(training):
    ids = training.get_tokenizer().encode("one two three")
    return types.Datum(
        model_input=types.ModelInput.from_ints(ids[:-1]),
        loss_fn_inputs={"target_tokens": ids[1:], "weights": [1.0] * (len(ids) - 1)},
    )


def test_the_bundles_are_one_placement_group_as_configured(slow):
    service, _ = slow
    table = placement_group_table(service._ray.placement_group)
    assert table["strategy"] == "PACK" and table["state"] == "CREATED"
    assert list(table["bundles"].values()) == [{"CPU": 1.0}, {"CPU": 1.0}, {"CPU": 1.0}]  # learner, 2 samplers


def test_slow_samplers_hold_at_most_max_in_flight_each_and_never_block_the_learner(slow):
    """16 requests at 0.4 s on two samplers (~3.2 s): submitting returns at once, the rest wait
    in the controller, and a learner step submitted after them finishes before them."""
    service, training = slow
    sampler = training.save_weights_and_get_sampling_client()
    prompt = types.ModelInput.from_ints([1, 2, 3])
    t0 = time.monotonic()
    futures = [sampler.sample(prompt, 1, types.SamplingParams(max_tokens=2, seed=i)) for i in range(16)]
    assert time.monotonic() - t0 < SAMPLE_DELAY  # nothing waited for a sampler
    assert service.sampler_pool.stats()["waiting"] >= 12  # 2 handed out, the rest queued here
    fwd = training.forward_backward([datum(training)], "cross_entropy")
    opt = training.optim_step(types.AdamParams(learning_rate=1e-3))
    fwd.result(timeout=60), opt.result(timeout=60)
    assert sum(done(f) for f in futures) < len(futures)  # the learner did not wait for the sampling
    wait_all(futures, timeout=120)
    stats = service.sampler_pool.stats()
    assert stats["peak_in_flight"] == [1, 1] and stats["waiting"] == 0
    assert sum(stats["served"]) >= 16 and min(stats["served"]) > 0  # both samplers worked


def test_a_slow_learner_never_blocks_the_samplers(slow):
    """Three queued 2-s learner steps; sampling submitted after them is answered while the
    learner still works, and a sampler snapshot taken after the steps waits for them only."""
    _, training = slow
    sampler = training.save_weights_and_get_sampling_client()
    steps = []
    for _ in range(3):
        training.forward_backward([datum(training)], "cross_entropy")
        steps.append(training.optim_step(types.AdamParams(learning_rate=1e-3)))
    prompt = types.ModelInput.from_ints([1, 2, 3])
    answers = wait_all(
        [sampler.sample(prompt, 1, types.SamplingParams(max_tokens=2, seed=i)) for i in range(4)], timeout=60
    )
    assert len(answers) == 4 and not done(steps[-1])  # answered while the learner still trains
    version = training.version
    newer = training.save_weights_and_get_sampling_client()  # queued behind the three steps
    assert all(done(s) for s in steps) and newer.version == version + 3


def test_placement_that_cannot_be_met_is_a_one_line_error(ray_here, slow):
    live = {k for k, v in placement_group_table().items() if v["state"] != "REMOVED"}  # the slow fixture's
    config = RayClientConfig(learner=Bundle(CPU=64), placement_timeout_s=2)
    with pytest.raises(TrinityError, match=r"Ray could not place the client's bundles .*CPU.*64.* within 2 s"):
        tinker.ServiceClient(backend="ray", ray=config)
    assert ray_here.is_initialized()  # the failed service did not shut down the Ray it did not start
    assert {k for k, v in placement_group_table().items() if v["state"] != "REMOVED"} == live  # no group left


@pytest.mark.parametrize(
    "values, message",
    [
        ({"strategy": "TIGHT"}, r"^ray.strategy 'TIGHT' unknown; expected one of PACK, STRICT_PACK"),
        ({"sampler": {"CPU": 1}}, r"^ray.sampler: unknown key; expected one of address, learner"),
        ({"samplers": {"count": 0}}, r"^ray.samplers.count must be an integer >= 1, got 0$"),
        ({"learner": {"CPUS": 1}}, r"^ray.learner.CPUS: unknown resource; expected CPU or GPU$"),
        ({"max_in_flight": 0}, r"^ray.max_in_flight must be >= 1, got 0$"),
        ({"address": "auto", "num_cpus": 2}, r"^ray.num_cpus sizes a Ray started here"),
    ],
)
def test_bad_config_is_a_one_line_error_naming_the_key(values, message):
    with pytest.raises(ConfigError, match=message):
        RayClientConfig.from_dict(values)


def test_strict_pack_is_passed_to_ray_and_close_fails_what_is_left(ray_here, tmp_path):
    config = RayClientConfig.from_dict(
        {"strategy": "STRICT_PACK", "samplers": [{"CPU": 0.5}], "max_in_flight": 1, "sampler_delay_s": 1.0}
    )
    with tinker.ServiceClient(backend="ray", ray=config, log_dir=tmp_path) as service:
        group = service._ray.placement_group
        table = placement_group_table(group)
        assert table["strategy"] == "STRICT_PACK" and list(table["bundles"].values()) == [{"CPU": 1.0}, {"CPU": 0.5}]
        sampler = service.create_sampling_client(base_model="tiny-random")
        futures = [
            sampler.sample(types.ModelInput.from_ints([1, 2]), 1, types.SamplingParams(max_tokens=2, seed=i))
            for i in range(3)
        ]  # one running (1 s), two waiting when the service closes
    for future in futures:  # each answered once: with an error, none left hanging
        with pytest.raises(TrinityError, match="closed"):
            future.result(timeout=60)
    assert placement_group_table(group)["state"] == "REMOVED"  # close() removed what it made
