"""A sampler names the weights it holds (``SamplingClient.weights_digest``) and refuses to sample
from weights that are not those it was given, in this process (behind ``trinity-like serve``:
``tests/serve/test_sampler_identity.py``). The faults are injected on the engine's own load path
(``TRINITY_LIKE_WEIGHT_FAULT``, :func:`trinity_like.fault_points.arriving_weights`); the oracle
digest is computed from an independent model that loaded the same weights."""

from __future__ import annotations

import re

import pytest
import torch
from tinker import types

from trinity_like import fault_points
from trinity_like.client.sampling import SamplingClient
from trinity_like.models.resolve import load_model, resolve_model_path
from trinity_like.models.weight_digest import model_digest

ENV = fault_points.WEIGHT_ENV_VAR
REFUSED = re.compile(r"sampler weights v(\d+) \((.*)\): the engine holds digest (\w+), expected (\w+)")


@pytest.fixture(scope="module")
def base():
    return load_model(resolve_model_path("tiny-random"))


def perturbed(model, seed):
    gen = torch.Generator().manual_seed(seed)
    weights = {k: v + 0.1 * torch.randn(v.shape, generator=gen) for k, v in model.state_dict().items()}
    return {**weights, "lm_head.weight": weights["model.embed_tokens.weight"]}


def oracle(model, weights) -> str:
    reference = model.__class__(model.config).eval()
    reference.load_state_dict(weights)
    return model_digest(reference)


def sample(client, n=1):
    return client.sample(types.ModelInput.from_ints([1, 2, 3]), n, types.SamplingParams(max_tokens=4, seed=0)).result(
        timeout=120
    )


def arm(monkeypatch, kind: str) -> None:
    """Spoil the next weight update this process's engines receive."""
    monkeypatch.setattr(fault_points, "_loads", 0)
    monkeypatch.setenv(ENV, f"{kind}:1")


def test_in_memory_and_folder_samplers_report_the_digest_of_what_they_hold(base, tmp_path):
    model, _ = base
    weights = perturbed(model, 1)
    in_memory = SamplingClient("tiny-random", weights=weights, version=3)
    assert in_memory.weights_digest == oracle(model, weights)
    folder = in_memory.save_weights(tmp_path / "w")
    from_folder = SamplingClient("tiny-random", model_path=folder, version=3)
    assert sample(from_folder).sequences and from_folder.weights_digest == oracle(model, weights)
    assert SamplingClient("tiny-random").weights_digest == model_digest(model)


@pytest.mark.parametrize("kind, seed", [("drop", 2), ("all_but_one", 5)])
def test_a_spoiled_load_is_refused_with_both_digests(base, tmp_path, monkeypatch, kind, seed):
    model, _ = base
    weights = perturbed(model, seed)  # not what the shared engine holds already
    arm(monkeypatch, kind)
    with pytest.raises(ValueError, match=REFUSED) as err:
        sample(SamplingClient("tiny-random", weights=weights, version=5))
    version, _, found, expected = REFUSED.search(str(err.value)).groups()
    assert version == "5" and expected == oracle(model, weights) and found != expected
    monkeypatch.delenv(ENV)
    assert sample(SamplingClient("tiny-random", weights=weights, version=5)).sequences  # loaded again, whole


def test_a_folder_whose_weights_were_rewritten_after_saving_is_refused(base, tmp_path):
    """The digests saved beside the weights are what the trainer saved: a folder changed since is refused."""
    from safetensors.torch import save_file

    model, _ = base
    folder = SamplingClient("tiny-random", weights=perturbed(model, 3)).save_weights(tmp_path / "w")
    save_file(
        {k: v.contiguous() for k, v in perturbed(model, 4).items() if k != "lm_head.weight"},
        str(folder / "model.safetensors"),
    )
    with pytest.raises(ValueError, match=REFUSED):
        sample(SamplingClient("tiny-random", model_path=folder))
