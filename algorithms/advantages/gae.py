"""GAE: generalised advantage estimation for PPO with a critic.

    delta_t = r_t + gamma * V_{t+1} - V_t
    A_t     = delta_t + gamma * lambda * A_{t+1}                         GAE eq. 16
    R_t     = A_t + V_t   (the critic's target);   A is then whitened over the batch

r_t are token-level rewards: the sequence score on the last response token, minus the
per-token KL penalty when the algorithm shapes rewards with KL (InstructGPT eq. 2).
Masked-out tokens are skipped (value and advantage carried through), as verl does.
Schulman et al. 2016, "High-Dimensional Continuous Control Using Generalized Advantage
Estimation", arXiv:1506.02438.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from trinity_like.ops import masked_whiten
from trinity_like.registry import ADVANTAGE_FN


@dataclass(frozen=True)
class GAEParams:
    gamma: float = 1.0  # discount per response token
    lam: float = 0.95  # lambda: bias (0, one-step TD) vs variance (1, Monte Carlo)
    whiten: bool = True  # normalise advantages to mean 0, std 1 over the batch's tokens


@ADVANTAGE_FN.register_module("gae")
def gae_advantage(
    *,
    token_level_rewards: torch.Tensor,  # [B, R]
    values: torch.Tensor,  # [B, R] the critic's values at rollout time
    action_mask: torch.Tensor,  # [B, R]
    params: GAEParams,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GAE (Schulman et al. 2016): PPO advantages and returns from a critic's values."""
    on = (action_mask > 0).to(values.dtype)
    adv_BR = torch.zeros_like(values)
    next_value_B = torch.zeros_like(values[:, 0])
    next_adv_B = torch.zeros_like(values[:, 0])
    for t in reversed(range(values.shape[1])):
        delta_B = token_level_rewards[:, t] + params.gamma * next_value_B - values[:, t]
        adv_t = delta_B + params.gamma * params.lam * next_adv_B
        next_value_B = on[:, t] * values[:, t] + (1 - on[:, t]) * next_value_B
        next_adv_B = on[:, t] * adv_t + (1 - on[:, t]) * next_adv_B
        adv_BR[:, t] = next_adv_B
    returns_BR = adv_BR + values
    if params.whiten:
        adv_BR = masked_whiten(adv_BR, on)
    return adv_BR * on, returns_BR * on
