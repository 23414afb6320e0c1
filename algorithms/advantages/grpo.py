"""GRPO group-relative advantages, and the plain group-centred variant.

    A_i = (r_i - mean_g(r)) / (std_g(r) + eps)     on every response token of row i   GRPO eq. 3
    A_i =  r_i - mean_g(r)                         with norm_by_std = False (Dr.GRPO)

g is row i's group (the samples of one prompt); std is the unbiased sample std. A group
of one has no baseline to compare with: its advantage is 0.
Shao et al. 2024, "DeepSeekMath", arXiv:2402.03300, sec. 4.1.2; Liu et al. 2025,
"Understanding R1-Zero-Like Training" (Dr.GRPO), arXiv:2503.20783, which drops the std.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from trinity_like.ops import group_stats
from trinity_like.registry import ADVANTAGE_FN


@dataclass(frozen=True)
class GRPOParams:
    norm_by_std: bool = True  # divide by the group's std; False is Dr.GRPO
    epsilon: float = 1e-6  # added to the std so a zero-variance group does not divide by 0


@ADVANTAGE_FN.register_module("grpo")
def grpo_advantage(
    *,
    rewards: torch.Tensor,  # [B] sequence scores
    action_mask: torch.Tensor,  # [B, R]
    group_index: torch.Tensor,  # [B] long, one index per prompt
    params: GRPOParams,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GRPO: reward minus its group's mean, divided by the group's std unless norm_by_std=False (Dr.GRPO)."""
    mean_B, std_B, size_B = group_stats(rewards, group_index)
    adv_B = rewards - mean_B
    if params.norm_by_std:
        adv_B = adv_B / (std_B + params.epsilon)
    adv_B = torch.where(size_B > 1, adv_B, torch.zeros_like(adv_B))
    adv_BR = adv_B.unsqueeze(-1) * (action_mask > 0)
    return adv_BR, adv_BR


@ADVANTAGE_FN.register_module("group_centered")
def group_centered_advantage(
    *,
    rewards: torch.Tensor,  # [B] sequence scores
    action_mask: torch.Tensor,  # [B, R]
    group_index: torch.Tensor,  # [B] long
) -> tuple[torch.Tensor, torch.Tensor]:
    """Reward minus its group's mean, nothing else."""
    mean_B, _, _ = group_stats(rewards, group_index)
    adv_BR = (rewards - mean_B).unsqueeze(-1) * (action_mask > 0)
    return adv_BR, adv_BR
