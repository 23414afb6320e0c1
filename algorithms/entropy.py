"""Entropy losses (ENTROPY_LOSS_FN): an optional bonus for keeping the policy's entropy up.

    L = -coef * aggregate(H_t),   H_t = -sum_v pi(v | context_t) log pi(v | context_t)

Subtracting entropy from the loss discourages premature collapse of the policy (Williams
& Peng 1991, "Function optimization using connectionist RL algorithms"; PPO, arXiv:1707.06347, eq. 9).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from trinity_like.ops import AggParams, Number, masked_mean
from trinity_like.registry import ENTROPY_LOSS_FN


@dataclass(frozen=True)
class EntropyParams(AggParams):
    coef: float = 0.001  # weight of the entropy bonus


@ENTROPY_LOSS_FN.register_module("entropy")
def entropy_bonus(
    *,
    entropy: torch.Tensor,  # [B, R] entropy of the policy's next-token distribution
    action_mask: torch.Tensor,  # [B, R]
    params: EntropyParams,
    num_tokens: Number | None = None,
    num_seqs: Number | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Entropy bonus: -coef * aggregated token entropy."""
    loss = -params.coef * params.aggregate(entropy, action_mask, num_tokens=num_tokens, num_seqs=num_seqs)
    return loss, {"entropy": masked_mean(entropy.detach(), action_mask).item()}


@ENTROPY_LOSS_FN.register_module("none")
def no_entropy(*, action_mask: torch.Tensor) -> tuple[torch.Tensor, dict[str, float]]:
    """No entropy term (asks for no entropy, so none is computed)."""
    return action_mask.new_zeros((), dtype=torch.float32), {}
