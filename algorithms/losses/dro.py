"""DRO: a log-likelihood policy gradient with a quadratic penalty on leaving the sampler.

    L_t = -(A_t * logprob_t - beta / 2 * (logprob_t - old_logprob_t) ** 2)

Richemond et al. 2024, "Offline Regularised Reinforcement Learning for Large Language
Models Alignment" (Direct Reward Optimisation), arXiv:2405.19107; Kimi k1.5 (2025),
arXiv:2501.12599, sec. 2.3. Off-policy and even offline: the penalty, not a clip, keeps
the learner near the policy that sampled. Its (soft) advantages are the caller's
(Tinker's ``dro`` loss takes them as given).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from trinity_like.ops import AggParams, Number, ratio_metrics
from trinity_like.registry import POLICY_LOSS_FN


@dataclass(frozen=True)
class DROParams(AggParams):
    beta: float = 0.05  # weight of the quadratic penalty on log(pi / pi_old); Tinker's documented example value

    def __post_init__(self) -> None:
        if self.beta < 0:
            raise ValueError(f"beta must be >= 0, got {self.beta}")


@POLICY_LOSS_FN.register_module("dro")
def dro_loss(
    *,
    logprob: torch.Tensor,  # [B, R] log pi_theta
    old_logprob: torch.Tensor,  # [B, R] log pi_old (the sampling policy)
    advantages: torch.Tensor,  # [B, R]
    action_mask: torch.Tensor,  # [B, R]
    params: DROParams,
    num_tokens: Number | None = None,
    num_seqs: Number | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """DRO: -(A log pi - beta/2 (log pi - log pi_old)^2), a quadratic penalty instead of a clip."""
    log_ratio = logprob - old_logprob
    loss_BR = -(advantages * logprob - 0.5 * params.beta * log_ratio**2)
    loss = params.aggregate(loss_BR, action_mask, num_tokens=num_tokens, num_seqs=num_seqs)
    return loss, ratio_metrics(log_ratio.detach().clamp(-20.0, 20.0), action_mask)
