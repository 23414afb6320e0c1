"""GSPO: PPO clipping on a sequence-level, length-normalised importance ratio.

    s_i     = exp( mean_t (logprob_it - old_logprob_it) )                 GSPO eq. 7
    s_it    = sg[s_i] * pi(y_it) / sg[pi(y_it)]      (value s_i, token-wise gradient)
    L_it    = max(-A_i s_it, -A_i clip(s_it, 1 - eps_low, 1 + eps_high))

Zheng et al. 2025, "Group Sequence Policy Optimization", arXiv:2507.18071. The paper
aggregates per sequence ("seq-mean-token-mean") and clips at 3e-4 / 4e-4 (sec. 5.1).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from trinity_like.ops import AggMode, AggParams, Number, masked_mean, ratio_metrics
from trinity_like.registry import POLICY_LOSS_FN


@dataclass(frozen=True)
class GSPOParams(AggParams):
    loss_agg_mode: AggMode = "seq-mean-token-mean"  # GSPO's sequence-level objective
    clip_ratio_low: float = 3e-4  # eps_low on the sequence ratio
    clip_ratio_high: float = 4e-4  # eps_high on the sequence ratio


@POLICY_LOSS_FN.register_module("gspo")
def gspo_loss(
    *,
    logprob: torch.Tensor,  # [B, R] log pi_theta
    old_logprob: torch.Tensor,  # [B, R] log pi_old
    advantages: torch.Tensor,  # [B, R] (constant along a sequence for GRPO advantages)
    action_mask: torch.Tensor,  # [B, R]
    params: GSPOParams,
    num_tokens: Number | None = None,
    num_seqs: Number | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """GSPO: clipped surrogate on the length-normalised sequence ratio (Zheng et al. 2025)."""
    log_ratio = logprob - old_logprob
    seq_log_ratio_B = masked_mean(log_ratio, action_mask, dim=-1)
    token_log_ratio = logprob - logprob.detach() + seq_log_ratio_B.detach().unsqueeze(-1)
    ratio = token_log_ratio.clamp(max=10.0).exp()  # as verl: keep exp finite
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1 - params.clip_ratio_low, 1 + params.clip_ratio_high)
    loss_BR = torch.maximum(unclipped, clipped)
    loss = params.aggregate(loss_BR, action_mask, num_tokens=num_tokens, num_seqs=num_seqs)
    metrics = {"clip_frac": masked_mean((clipped > unclipped).float(), action_mask).item()}
    return loss, {**metrics, **ratio_metrics(log_ratio, action_mask)}
