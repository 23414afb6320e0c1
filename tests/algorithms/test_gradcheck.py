"""Finite-difference gradient checks (float64) for every loss, KL estimator and the KL term."""

from __future__ import annotations

import pytest
import torch
from _lib.algo_testlib import DT, autograd_grad, fd_grad, rand_batch

from trinity_like import ops
from trinity_like.components import build_params, call_component
from trinity_like.registry import ENTROPY_LOSS_FN, KL_FN, POLICY_LOSS_FN


def loss_of(registry, name, batch, wrt, **params):
    fn = registry.get(name)
    p = build_params(fn, params)
    return lambda x: call_component(fn, {**batch, wrt: x}, p)[0]


def check(f, x):
    assert torch.autograd.gradcheck(f, (x.detach().clone().requires_grad_(True),), eps=1e-6, atol=1e-7, rtol=1e-5)


CASES = [
    ("ppo", "logprob", {}),
    ("ppo", "logprob", {"clip_ratio_high": 0.28, "clip_ratio_c": 3.0}),
    ("importance_sampling", "logprob", {}),
    ("sft", "logprob", {}),
    ("mix", "logprob", {"mu": 0.3}),
    ("value_clip", "values", {"cliprange_value": 0.3}),
    ("gspo", "logprob", {"clip_ratio_low": 0.05, "clip_ratio_high": 0.05}),
]


@pytest.mark.parametrize("name, wrt, params", CASES)
@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
def test_token_losses(name, wrt, params, mode):
    b = rand_batch(B=5, R=4, seed=7)
    # GSPO's token gradient equals its sequence objective's when A is constant along a sequence
    b["advantages"] = b["advantages"][:, :1].expand(-1, 4).contiguous()
    if name != "gspo":
        b["logprob"][1, 0], b["advantages"][1, 0] = b["old_logprob"][1, 0] + 1.5, -1.0  # dual clip region
    check(loss_of(POLICY_LOSS_FN, name, b, wrt, loss_agg_mode=mode, **params), b[wrt])


def test_ppo_gradient_is_exercised_in_both_clip_regions():
    b = rand_batch(B=5, R=4, seed=7)
    _, metrics = POLICY_LOSS_FN.get("ppo")(
        **{k: b[k] for k in ("logprob", "old_logprob", "advantages", "action_mask")},
        params=build_params(POLICY_LOSS_FN.get("ppo"), {}),
    )
    assert 0 < metrics["clip_frac"] < 1


def test_entropy_bonus():
    b = rand_batch(B=4, R=5)
    check(loss_of(ENTROPY_LOSS_FN, "entropy", b, "entropy"), b["entropy"])


def test_dpo():
    g = torch.Generator().manual_seed(1)
    b = {"ref_logprob": -torch.rand(6, 4, generator=g, dtype=DT), "action_mask": torch.ones(6, 4, dtype=DT)}
    b["action_mask"][2, -1] = 0
    lp = b["ref_logprob"] + torch.randn(6, 4, generator=g, dtype=DT)
    check(loss_of(POLICY_LOSS_FN, "dpo", b, "logprob", beta=0.5, label_smoothing=0.1), lp)


def test_bradley_terry():
    check(lambda s: POLICY_LOSS_FN.get("bradley_terry")(scores=s)[0], torch.randn(8, dtype=DT))


def test_cispo_gradient_is_the_is_gradient_inside_and_a_capped_reinforce_outside():
    """CISPO stops the gradient through its weight, so finite differences of the loss itself do not
    apply; the oracle is the equation: inside the clip range the gradient is the importance-sampling
    loss's, -A r grad log pi; outside it is REINFORCE's with the weight fixed at the cap."""
    b = rand_batch(B=5, R=4, seed=3)
    high = 0.1
    ratio = (b["logprob"] - b["old_logprob"]).exp()
    inside = ratio <= 1 + high
    assert inside.any() and (~inside & (b["action_mask"] > 0)).any()
    grad = autograd_grad(loss_of(POLICY_LOSS_FN, "cispo", b, "logprob", clip_ratio_high=high), b["logprob"])
    m, n = b["action_mask"], b["action_mask"].sum()
    capped = lambda lp: (-(1 + high) * b["advantages"] * lp * m).sum() / n  # noqa: E731
    is_loss = lambda lp: (-b["advantages"] * (lp - b["old_logprob"]).exp() * m).sum() / n  # noqa: E731
    expected = torch.where(inside, fd_grad(is_loss, b["logprob"]), fd_grad(capped, b["logprob"]))
    assert torch.allclose(grad, expected, atol=1e-7)


@pytest.mark.parametrize("name", ["k1", "k2", "k3", "abs"])
def test_kl_estimators(name):
    g = torch.Generator().manual_seed(0)
    ref = -torch.rand(3, 4, generator=g, dtype=DT) * 2
    lp = ref + torch.randn(3, 4, generator=g, dtype=DT)
    fn = KL_FN.get(name)
    check(lambda x: fn(logprob=x, ref_logprob=ref).sum(), lp)
    mask = (torch.arange(4) < torch.tensor([[4], [2], [3]])).to(DT)
    check(lambda x: ops.kl_loss_term(fn(logprob=x, ref_logprob=ref), mask, coef=0.1)[0], lp)
