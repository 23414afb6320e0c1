"""KL estimators: their expectation under pi against the exact KL of two categorical distributions."""

from __future__ import annotations

import math

import pytest
import torch
from _lib.algo_testlib import DT

from trinity_like.registry import KL_FN


def two_policies(seed: int, V: int = 11):
    """Two distributions close enough that k3's stability clamp (at 10, as verl) is inactive."""
    g = torch.Generator().manual_seed(seed)
    pi = torch.log_softmax(0.7 * torch.randn(V, generator=g, dtype=DT), -1)
    ref = torch.log_softmax(0.7 * torch.randn(V, generator=g, dtype=DT), -1)
    return pi, ref


@pytest.mark.parametrize("name", ["k1", "k3", "low_var_kl"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_k1_and_k3_are_unbiased(name, seed):
    pi, ref = two_policies(seed)
    assert ((ref - pi).exp() < 10).all()
    exact = torch.distributions.kl_divergence(
        torch.distributions.Categorical(logits=pi), torch.distributions.Categorical(logits=ref)
    )
    expectation = (pi.exp() * KL_FN.get(name)(logprob=pi, ref_logprob=ref)).sum()  # E_{x ~ pi}[k(x)]
    assert expectation.item() == pytest.approx(exact.item(), rel=1e-10)


def test_by_hand_and_signs():
    lp, ref = torch.tensor([math.log(0.5)], dtype=DT), torch.tensor([math.log(0.25)], dtype=DT)
    x = math.log(0.25 / 0.5)
    assert KL_FN.get("k1")(logprob=lp, ref_logprob=ref).item() == pytest.approx(-x)
    assert KL_FN.get("k2")(logprob=lp, ref_logprob=ref).item() == pytest.approx(x * x / 2)
    assert KL_FN.get("k3")(logprob=lp, ref_logprob=ref).item() == pytest.approx(0.5 - x - 1)
    assert KL_FN.get("abs")(logprob=ref, ref_logprob=lp).item() == pytest.approx(abs(x))
    pi, ref = two_policies(5)
    assert (KL_FN.get("k3")(logprob=pi, ref_logprob=ref) >= 0).all()  # k3 never negative
    assert (KL_FN.get("k1")(logprob=pi, ref_logprob=ref) < 0).any()  # k1 can be


def test_k2_gradient_is_the_true_kl_gradient_at_the_reference():
    """At pi = ref, d/dlogprob of k2 is 0, as is the gradient of KL(pi||ref) there."""
    pi, _ = two_policies(3)
    lp = pi.clone().requires_grad_(True)
    KL_FN.get("k2")(logprob=lp, ref_logprob=pi).sum().backward()
    assert (lp.grad == 0).all()
