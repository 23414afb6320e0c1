"""Tinker's named losses through our registry, against hand computation in float64."""

from __future__ import annotations

import pytest
import torch

from trinity_like.client.losses import TINKER_LOSSES, loss_inputs, loss_spec, required_arrays
from trinity_like.components import call_component
from trinity_like.errors import ConfigError

T = 7


def run(name, lp, arrays, mask=None, config=None):
    spec = loss_spec(name, config)
    mask = torch.ones_like(lp) if mask is None else mask
    return call_component(spec.fn, loss_inputs(name, lp, arrays, mask), spec.params)


def leaf(*values):
    return torch.tensor([values], dtype=torch.float64, requires_grad=True)


def test_cross_entropy_is_minus_the_weighted_sum_of_logprobs():
    g = torch.Generator().manual_seed(0)
    lp = (-torch.rand(2, T, generator=g, dtype=torch.float64)).requires_grad_()
    weights = torch.randint(0, 2, (2, T), generator=g).double()
    mask = torch.ones(2, T, dtype=torch.float64)
    mask[1, -2:] = 0  # padding of the shorter datum
    loss, _ = run("cross_entropy", lp, {"weights": weights}, mask)
    assert loss.item() == pytest.approx(-(lp * weights * mask).sum().item(), abs=1e-12)


def test_importance_sampling_is_reinforce_when_the_logprobs_agree():
    lp = leaf(-0.5, -1.0, -2.0)
    adv = torch.tensor([[1.0, -2.0, 0.5]], dtype=torch.float64)
    loss, _ = run("importance_sampling", lp, {"logprobs": lp.detach().clone(), "advantages": adv})
    (grad,) = torch.autograd.grad(loss, lp)
    reinforce = leaf(-0.5, -1.0, -2.0)
    (expected,) = torch.autograd.grad(-(adv * reinforce).sum(), reinforce)
    assert loss.item() == pytest.approx(-adv.sum().item())
    torch.testing.assert_close(grad, expected, rtol=0, atol=1e-12)


@pytest.mark.parametrize("advantage", [1.0, -1.0])
def test_ppo_gradient_is_exactly_zero_past_the_clip_on_each_side(advantage):
    sampler = torch.zeros(1, 3, dtype=torch.float64)
    # ratios 1.5 (past 1.2), 0.5 (below 0.8), 1.05 (inside)
    lp = leaf(
        torch.log(torch.tensor(1.5)).item(), torch.log(torch.tensor(0.5)).item(), torch.log(torch.tensor(1.05)).item()
    )
    adv = torch.full((1, 3), advantage, dtype=torch.float64)
    loss, metrics = run("ppo", lp, {"logprobs": sampler, "advantages": adv})
    (grad,) = torch.autograd.grad(loss, lp)
    ratio = lp.detach().exp()
    # the clipped side: A > 0 past 1 + eps_high, A < 0 below 1 - eps_low
    clipped = 0 if advantage > 0 else 1
    assert grad[0, clipped].item() == 0.0
    assert grad[0, 2].item() == pytest.approx(-advantage * ratio[0, 2].item(), abs=1e-12)
    expected = -torch.minimum(ratio * adv, ratio.clamp(0.8, 1.2) * adv).sum()
    assert loss.item() == pytest.approx(expected.item(), abs=1e-12)
    assert metrics["clip_frac"] == pytest.approx(1 / 3)


def test_ppo_thresholds_come_from_loss_fn_config():
    spec = loss_spec("ppo", {"clip_low_threshold": 0.7, "clip_high_threshold": 1.28})
    assert (spec.params.clip_ratio_low, spec.params.clip_ratio_high) == pytest.approx((0.3, 0.28))
    assert spec.params.loss_agg_mode == "token-sum"


def test_cispo_weighs_logprob_by_the_clipped_detached_ratio():
    lp = leaf(0.3, -0.4, 0.0)
    sampler = torch.zeros(1, 3, dtype=torch.float64)
    adv = torch.tensor([[2.0, -1.0, 0.5]], dtype=torch.float64)
    loss, _ = run("cispo", lp, {"logprobs": sampler, "advantages": adv})
    weight = lp.detach().exp().clamp(0.8, 1.2)
    assert loss.item() == pytest.approx(-(weight * lp.detach() * adv).sum().item(), abs=1e-12)
    (grad,) = torch.autograd.grad(loss, lp)
    torch.testing.assert_close(grad, -weight * adv, rtol=0, atol=1e-12)


def test_dro_is_the_log_likelihood_gradient_with_a_quadratic_penalty():
    lp = leaf(-0.2, -1.5)
    sampler = torch.tensor([[-0.5, -1.0]], dtype=torch.float64)
    adv = torch.tensor([[1.0, 2.0]], dtype=torch.float64)
    loss, _ = run("dro", lp, {"logprobs": sampler, "advantages": adv}, config={"beta": 0.1})
    expected = -(lp.detach() * adv - 0.05 * (lp.detach() - sampler) ** 2).sum()
    assert loss.item() == pytest.approx(expected.item(), abs=1e-12)


def test_a_registered_loss_is_callable_by_its_own_name():
    spec = loss_spec("gspo")  # not a Tinker name: the registry's entry with its own params
    assert spec.name == "gspo" and required_arrays("gspo") == ("target_tokens",)


def test_bad_names_and_options_are_clear_errors():
    with pytest.raises(ConfigError, match=r"unknown loss_fn 'ppp' \(Tinker's: cross_entropy, importance_sampling, ppo"):
        loss_spec("ppp")
    with pytest.raises(
        ConfigError,
        match=r"loss_fn_config: 'ppo' takes \['clip_high_threshold', 'clip_low_threshold'\], not \['beta'\]",
    ):
        loss_spec("ppo", {"beta": 1.0})
    with pytest.raises(ConfigError, match="no options"):
        loss_spec("cross_entropy", {"x": 1})
    assert set(TINKER_LOSSES) == {"cross_entropy", "importance_sampling", "ppo", "cispo", "dro"}
