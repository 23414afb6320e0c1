"""CISPO: REINFORCE weighted by a clipped, stop-gradient importance ratio.

    w_t = sg[ clip(r_t, 1 - eps_low, 1 + eps_high) ],   r_t = exp(logprob_t - old_logprob_t)
    L_t = -w_t * A_t * logprob_t                                          MiniMax-M1 eq. 4

Unlike PPO, a clipped token keeps its gradient (only its weight is capped).
MiniMax et al. 2025, "MiniMax-M1", arXiv:2506.13585, sec. 3.1; they leave the lower
bound open (eps_low large) and tune only eps_high.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from trinity_like.ops import AggParams, Number, masked_mean, ratio_metrics
from trinity_like.registry import POLICY_LOSS_FN


@dataclass(frozen=True)
class CISPOParams(AggParams):
    clip_ratio_low: float = 1.0  # eps_low; 1.0 puts the lower bound at 0, i.e. none (as MiniMax-M1)
    clip_ratio_high: float = 0.2  # eps_high: weights above 1 + eps_high are capped


@POLICY_LOSS_FN.register_module("cispo")
def cispo_loss(
    *,
    logprob: torch.Tensor,  # [B, R] log pi_theta
    old_logprob: torch.Tensor,  # [B, R] log pi_old
    advantages: torch.Tensor,  # [B, R]
    action_mask: torch.Tensor,  # [B, R]
    params: CISPOParams,
    num_tokens: Number | None = None,
    num_seqs: Number | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """CISPO: clipped importance weight, stop-gradient, times A log pi (MiniMax-M1)."""
    log_ratio = (logprob - old_logprob).clamp(-20.0, 20.0)
    ratio = log_ratio.exp()
    weight = ratio.clamp(1 - params.clip_ratio_low, 1 + params.clip_ratio_high).detach()
    loss_BR = -weight * advantages * logprob
    loss = params.aggregate(loss_BR, action_mask, num_tokens=num_tokens, num_seqs=num_seqs)
    metrics = {"clip_frac": masked_mean((ratio.detach() != weight).float(), action_mask).item()}
    return loss, {**metrics, **ratio_metrics(log_ratio, action_mask)}
