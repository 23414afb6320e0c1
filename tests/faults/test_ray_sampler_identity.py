"""The client's Ray sampler actors refuse to sample from weights they do not hold, with the
in-process sampler's one line (``tests/client/test_sampler_identity.py``).

The fault is armed in this process (``TRINITY_LIKE_WEIGHT_FAULT``) after Ray has started, so
it reaches the sampler actors only through the ``runtime_env`` they are created with
(:func:`trinity_like.fault_points.env`): a Ray worker has the environment of the Ray that
runs it, not of the caller. With ``TRINITY_LIKE_FAULT_ONCE`` only one of two samplers is
spoiled: the update applied to one engine only. The oracle digests come from an independent
model that loaded the same weights, and from the starting model.
"""

from __future__ import annotations

import re

import pytest
import torch
from _lib.faultlib import record

import trinity_like.client as tinker
from trinity_like import fault_points
from trinity_like.client.ray import Bundle, RayClientConfig
from trinity_like.client.sampling import SamplingClient
from trinity_like.models.resolve import load_model
from trinity_like.models.weight_digest import model_digest

types = tinker.types
REFUSED = re.compile(r"^sampler weights v(\d+) \((.*)\): the engine holds digest (\w+), expected (\w+)$")


@pytest.fixture(scope="module")
def ray_here():
    import ray

    if ray.is_initialized():
        ray.shutdown()
    ray.init(address="local", num_cpus=4, include_dashboard=False, log_to_driver=False)
    try:
        yield ray
    finally:
        ray.shutdown()


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """Weights saved for sampling (with their digests beside them), and their digest and the start's."""
    model, _ = load_model("tiny-random", dtype=torch.float32)
    gen = torch.Generator().manual_seed(11)
    weights = {k: v + 0.1 * torch.randn(v.shape, generator=gen) for k, v in model.state_dict().items()}
    weights["lm_head.weight"] = weights["model.embed_tokens.weight"]
    path = SamplingClient("tiny-random", weights=weights).save_weights(tmp_path_factory.mktemp("w") / "w")
    reference = model.__class__(model.config).eval()
    reference.load_state_dict(weights)
    return path, model_digest(reference), model_digest(model)


def sample(sampler, seed: int):
    prompt = types.ModelInput.from_ints([1, 2, 3])
    return sampler.sample(prompt, 1, types.SamplingParams(max_tokens=4, seed=seed))


def outcome(future) -> str | None:
    """None for samples, else the refusal's one line."""
    try:
        assert future.result(timeout=120).sequences
        return None
    except ValueError as err:
        line = str(err)
        assert "\n" not in line and REFUSED.match(line), line
        return line


@pytest.mark.parametrize("kind", ["drop", "all_but_one"])
def test_a_spoiled_load_in_a_ray_sampler_is_refused_with_both_digests(ray_here, folder, tmp_path, monkeypatch, kind):
    path, sent, start = folder
    monkeypatch.setenv(fault_points.WEIGHT_ENV_VAR, f"{kind}:1")  # armed after Ray started: only runtime_env carries it
    config = RayClientConfig(samplers=(Bundle(),))
    with tinker.ServiceClient(backend="ray", ray=config, log_dir=tmp_path) as service:
        sampler = service.create_sampling_client(model_path=str(path), base_model="tiny-random")
        line = outcome(sample(sampler, 0))
    assert line is not None, "the spoiled sampler sampled"
    version, where, found, expected = REFUSED.match(line).groups()
    assert where == str(path.resolve()) and expected == sent and found != sent
    assert (found == start) == (kind == "drop")  # dropped: the start; all but one: neither


def test_an_update_applied_to_one_ray_sampler_of_two_is_refused_where_it_is_missing(
    ray_here, folder, tmp_path, monkeypatch, record_property
):
    path, sent, start = folder
    monkeypatch.setenv(fault_points.WEIGHT_ENV_VAR, "drop:1")
    monkeypatch.setenv(fault_points.ONCE_VAR, str(tmp_path / "once"))  # the first sampler to load is spoiled
    config = RayClientConfig(samplers=(Bundle(), Bundle()), max_in_flight=1, sampler_delay_s=0.5)
    with tinker.ServiceClient(backend="ray", ray=config, log_dir=tmp_path) as service:
        sampler = service.create_sampling_client(model_path=str(path), base_model="tiny-random")
        rounds = []
        for r in range(2):  # two requests at once, one in flight per sampler: one on each
            futures = [sample(sampler, 10 * r + i) for i in range(2)]
            rounds.append([outcome(f) for f in futures])
    for outcomes in rounds:  # the stale sampler refuses every time (each load is lost again); the other samples
        refused = [x for x in outcomes if x is not None]
        assert len(refused) == 1, rounds
        _, _, found, expected = REFUSED.match(refused[0]).groups()
        assert found == start and expected == sent
    record(
        record_property,
        "weight update applied to one Ray sampler of two (the client's Ray backend; also dropped and partial on one)",
        "the stale sampler refuses every request with one line (version, both digests); the other samples",
        "-",
        "-",
    )
