"""REINFORCE with an importance ratio and no clipping (Tinker's ``importance_sampling`` loss).

    L_t = -A_t * exp(logprob_t - old_logprob_t)

At ratio 1 its gradient is the vanilla policy gradient -A_t grad log pi (Williams 1992,
"Simple statistical gradient-following algorithms", Machine Learning 8); the ratio
corrects for sampling from pi_old (off-policy policy gradient, Degris et al. 2012).
"""

from __future__ import annotations

import torch

from trinity_like.ops import AggParams, Number, ratio_metrics
from trinity_like.registry import POLICY_LOSS_FN


@POLICY_LOSS_FN.register_module("importance_sampling")
def importance_sampling_loss(
    *,
    logprob: torch.Tensor,  # [B, R] log pi_theta
    old_logprob: torch.Tensor,  # [B, R] log pi_old (the sampling policy)
    advantages: torch.Tensor,  # [B, R]
    action_mask: torch.Tensor,  # [B, R]
    params: AggParams,
    num_tokens: Number | None = None,
    num_seqs: Number | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """REINFORCE with the importance ratio pi/pi_old, no clipping."""
    log_ratio = (logprob - old_logprob).clamp(-20.0, 20.0)
    loss_BR = -advantages * log_ratio.exp()
    loss = params.aggregate(loss_BR, action_mask, num_tokens=num_tokens, num_seqs=num_seqs)
    return loss, ratio_metrics(log_ratio, action_mask)
