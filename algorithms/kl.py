"""KL estimators (KL_FN): per-token estimates of KL(pi || ref) from the sampled tokens' logprobs.

With x = ref_logprob - logprob (log of ref/pi at a token sampled from pi):

    k1  = -x                    unbiased, high variance, can be negative
    k2  = x^2 / 2               biased, low variance; its gradient is the true KL's gradient
    k3  = exp(x) - x - 1        unbiased, low variance, never negative ("low_var_kl")
    abs = |x|

Schulman 2020, "Approximating KL Divergence", http://joschu.net/blog/kl-approx.html.
k3 is GRPO's KL term (DeepSeekMath, arXiv:2402.03300, eq. 4).

The trainer uses an estimator either as a loss term, ``coef * aggregate(kl)``
(``trinity_like.ops.kl_loss_term``, the algorithm's ``kl_loss`` slot), or as reward
shaping, ``r_t - coef * kl_t`` before advantages (``trinity_like.ops.apply_kl_penalty``,
the ``kl_penalty`` slot, where ``logprob`` is the sampling policy's).
"""

from __future__ import annotations

import torch

from trinity_like.registry import KL_FN


@KL_FN.register_module("k1")
def k1(*, logprob: torch.Tensor, ref_logprob: torch.Tensor) -> torch.Tensor:
    """k1 = log pi - log ref: the unbiased naive KL estimate (Schulman 2020)."""
    return logprob - ref_logprob


@KL_FN.register_module("k2")
def k2(*, logprob: torch.Tensor, ref_logprob: torch.Tensor) -> torch.Tensor:
    """k2 = (log pi - log ref)^2 / 2: low variance, biased (Schulman 2020)."""
    return 0.5 * (logprob - ref_logprob).square()


@KL_FN.register_module("k3")
def k3(*, logprob: torch.Tensor, ref_logprob: torch.Tensor) -> torch.Tensor:
    """k3 = ref/pi - log(ref/pi) - 1: unbiased, low variance, non-negative (Schulman 2020; GRPO's KL)."""
    x = (ref_logprob - logprob).clamp(-20.0, 20.0)  # as verl: keep exp finite
    return (torch.expm1(x) - x).clamp(-10.0, 10.0)


KL_FN.register_module("low_var_kl", module=k3)  # verl's name for k3


@KL_FN.register_module("abs")
def abs_kl(*, logprob: torch.Tensor, ref_logprob: torch.Tensor) -> torch.Tensor:
    """abs = |log pi - log ref|."""
    return (logprob - ref_logprob).abs()
