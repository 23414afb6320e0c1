"""REINFORCE++: discounted token-level returns, whitened over the whole batch (no critic, no groups).

    G_t = sum_{s >= t} gamma^(s-t) r_s,     r_s = score on the last token - beta * KL_s
    A_t = (G_t - mean_batch(G)) / std_batch(G)

The per-token KL penalty is the trainer's reward shaping (the algorithm's ``kl_penalty``
slot) applied to ``token_level_rewards`` before this runs. Hu 2025, "REINFORCE++",
arXiv:2501.03262, sec. 3. Masked-out tokens (tool output inside a response) carry the
running return through unchanged, as verl does.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from trinity_like.ops import masked_whiten
from trinity_like.registry import ADVANTAGE_FN


@dataclass(frozen=True)
class ReinforcePPParams:
    gamma: float = 1.0  # discount over response tokens


@ADVANTAGE_FN.register_module("reinforce_plus_plus")
def reinforce_plus_plus_advantage(
    *,
    token_level_rewards: torch.Tensor,  # [B, R] score on the last token, KL penalty per token
    action_mask: torch.Tensor,  # [B, R]
    params: ReinforcePPParams,
) -> tuple[torch.Tensor, torch.Tensor]:
    """REINFORCE++: discounted returns of token-level rewards, whitened across the batch."""
    on = (action_mask > 0).to(token_level_rewards.dtype)
    returns_BR = torch.zeros_like(token_level_rewards)
    running_B = torch.zeros_like(token_level_rewards[:, 0])
    for t in reversed(range(token_level_rewards.shape[1])):
        step_B = token_level_rewards[:, t] + params.gamma * running_B
        running_B = on[:, t] * step_B + (1 - on[:, t]) * running_B
        returns_BR[:, t] = on[:, t] * step_B
    return masked_whiten(returns_BR, on) * on, returns_BR
