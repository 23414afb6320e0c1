"""PPO's clipped value loss for the critic.

    V_clip = old_V + clip(V - old_V, -c, c)
    L_t    = 1/2 * max( (V_t - R_t)^2, (V_clip_t - R_t)^2 )

Keeps the critic's update near the values it had at rollout time, as PPO does for the
policy. Introduced in OpenAI baselines' ppo2; studied in Engstrom et al. 2020,
"Implementation Matters in Deep Policy Gradients", arXiv:2005.12729.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from trinity_like.ops import AggParams, Number, masked_mean
from trinity_like.registry import POLICY_LOSS_FN


@dataclass(frozen=True)
class ValueClipParams(AggParams):
    cliprange_value: float = 0.5  # c: how far a value may move from its rollout-time estimate


@POLICY_LOSS_FN.register_module("value_clip")
def value_clip_loss(
    *,
    values: torch.Tensor,  # [B, R] the critic's current predictions
    old_values: torch.Tensor,  # [B, R] its predictions at rollout time
    returns: torch.Tensor,  # [B, R] targets (GAE returns)
    action_mask: torch.Tensor,  # [B, R]
    params: ValueClipParams,
    num_tokens: Number | None = None,
    num_seqs: Number | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """PPO critic loss: clipped squared error of values against returns."""
    clipped_values = old_values + (values - old_values).clamp(-params.cliprange_value, params.cliprange_value)
    unclipped_err = (values - returns) ** 2
    clipped_err = (clipped_values - returns) ** 2
    loss_BR = torch.maximum(unclipped_err, clipped_err)
    loss = 0.5 * params.aggregate(loss_BR, action_mask, num_tokens=num_tokens, num_seqs=num_seqs)
    return loss, {
        "vf_clipfrac": masked_mean((clipped_err > unclipped_err).float(), action_mask).item(),
        "vpred_mean": masked_mean(values.detach(), action_mask).item(),
    }
