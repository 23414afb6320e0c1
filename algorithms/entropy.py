"""Entropy losses (ENTROPY_LOSS_FN): an optional bonus for keeping the policy's entropy up.

    L = -coef * aggregate(H_t),   H_t = -sum_v pi(v | context_t) log pi(v | context_t)

Subtracting entropy from the loss discourages premature collapse of the policy (Williams
& Peng 1991, "Function optimization using connectionist RL algorithms"; PPO, arXiv:1707.06347, eq. 9).
The function returns the unweighted term ``-aggregate(H_t)``; ``coef`` is the slot's
weight (``algorithm.entropy_loss.coef``), applied by the trainer's objective like the KL
loss's. ``name: none`` switches the slot off.
"""

from __future__ import annotations

import torch

from trinity_like.ops import AggParams, Number, masked_mean
from trinity_like.registry import ENTROPY_LOSS_FN


@ENTROPY_LOSS_FN.register_module("entropy")
def entropy_bonus(
    *,
    entropy: torch.Tensor,  # [B, R] entropy of the policy's next-token distribution
    action_mask: torch.Tensor,  # [B, R]
    params: AggParams,
    num_tokens: Number | None = None,
    num_seqs: Number | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Entropy bonus: minus the aggregated token entropy (weighted by the slot's coef)."""
    loss = -params.aggregate(entropy, action_mask, num_tokens=num_tokens, num_seqs=num_seqs)
    return loss, {"entropy": masked_mean(entropy.detach(), action_mask).item()}
