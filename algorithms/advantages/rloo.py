"""RLOO: REINFORCE with the leave-one-out mean of the other samples of the prompt as baseline.

    A_i = r_i - 1/(n-1) * sum_{j != i} r_j  =  n/(n-1) * (r_i - mean_g(r))

Kool et al. 2019, "Buy 4 REINFORCE samples, get a baseline for free!", ICLR workshop;
Ahmadian et al. 2024, "Back to Basics: Revisiting REINFORCE Style Optimization for
Learning from Human Feedback in LLMs", arXiv:2402.14740. A group of one gets 0.
"""

from __future__ import annotations

import torch

from trinity_like.ops import group_stats
from trinity_like.registry import ADVANTAGE_FN


@ADVANTAGE_FN.register_module("rloo")
def rloo_advantage(
    *,
    rewards: torch.Tensor,  # [B] sequence scores
    action_mask: torch.Tensor,  # [B, R]
    group_index: torch.Tensor,  # [B] long
) -> tuple[torch.Tensor, torch.Tensor]:
    """RLOO: reward minus the mean reward of the group's other samples."""
    mean_B, _, n_B = group_stats(rewards, group_index)
    adv_B = torch.where(n_B > 1, n_B / (n_B - 1).clamp_min(1) * (rewards - mean_B), torch.zeros_like(rewards))
    adv_BR = adv_B.unsqueeze(-1) * (action_mask > 0)
    return adv_BR, adv_BR
