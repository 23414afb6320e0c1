"""PPO clipped surrogate, with DAPO's clip-higher and optional dual-clip.

    r_t  = exp(logprob_t - old_logprob_t)
    L_t  = max(-A_t r_t, -A_t clip(r_t, 1 - eps_low, 1 + eps_high))        PPO, eq. 7
    L_t  = min(L_t, -c A_t)                     where A_t < 0              dual-clip

Schulman et al. 2017, "Proximal Policy Optimization Algorithms", arXiv:1707.06347.
Yu et al. 2025, "DAPO", arXiv:2503.14476, sec. 3.1: eps_high > eps_low ("clip-higher").
Ye et al. 2020, "Mastering Complex Control in MOBA Games with Deep RL", arXiv:1912.09729:
dual-clip bounds the loss of a negative advantage when the ratio is huge.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from trinity_like.ops import AggParams, Number, masked_mean, ratio_metrics
from trinity_like.registry import POLICY_LOSS_FN


@dataclass(frozen=True)
class PPOParams(AggParams):
    clip_ratio_low: float = 0.2  # eps_low: the ratio is clipped below at 1 - eps_low
    clip_ratio_high: float = 0.2  # eps_high: clipped above at 1 + eps_high; DAPO uses 0.28
    clip_ratio_c: float | None = None  # dual-clip bound c > 1 (3.0 in the paper); None: off

    def __post_init__(self) -> None:
        if self.clip_ratio_c is not None and self.clip_ratio_c <= 1.0:
            raise ValueError(f"clip_ratio_c must be > 1, got {self.clip_ratio_c}")


@POLICY_LOSS_FN.register_module("ppo")
def ppo_loss(
    *,
    logprob: torch.Tensor,  # [B, R] log pi_theta
    old_logprob: torch.Tensor,  # [B, R] log pi_old (the policy that sampled)
    advantages: torch.Tensor,  # [B, R]
    action_mask: torch.Tensor,  # [B, R]
    params: PPOParams,
    num_tokens: Number | None = None,
    num_seqs: Number | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """PPO clipped surrogate with separate low/high clip (DAPO clip-higher) and optional dual-clip."""
    log_ratio = (logprob - old_logprob).clamp(-20.0, 20.0)  # exp overflows beyond this
    ratio = log_ratio.exp()
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1 - params.clip_ratio_low, 1 + params.clip_ratio_high)
    loss_BR = torch.maximum(unclipped, clipped)
    metrics = {"clip_frac": masked_mean((clipped > unclipped).float(), action_mask).item()}
    if params.clip_ratio_c is not None:
        bound = -advantages * params.clip_ratio_c
        negative = advantages < 0
        metrics["clip_frac_lower"] = masked_mean(((loss_BR > bound) & negative).float(), action_mask).item()
        loss_BR = torch.where(negative, torch.minimum(loss_BR, bound), loss_BR)
    loss = params.aggregate(loss_BR, action_mask, num_tokens=num_tokens, num_seqs=num_seqs)
    return loss, {**metrics, **ratio_metrics(log_ratio, action_mask)}
