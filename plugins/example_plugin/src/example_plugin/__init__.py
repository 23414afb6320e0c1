"""Example trinity-like plugin: one policy loss, one algorithm type and one rollout engine.

Importing this module registers all three (the engine, ``hf_generate``, in
:mod:`.generate_engine`); trinity-like imports it through the ``trinity_like.plugins`` entry
point declared in this package's pyproject.toml.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from trinity_like.components import AlgorithmType
from trinity_like.ops import aggregate
from trinity_like.registry import ALGORITHM_TYPE, POLICY_LOSS_FN

from . import generate_engine  # noqa: F401  (registers the hf_generate rollout engine)


@dataclass(frozen=True)
class TISParams:
    truncation: float = 2.0  # C: importance weights above it are cut to C
    loss_agg_mode: str = "token-mean"  # how token losses are reduced (see trinity_like.ops)


@POLICY_LOSS_FN.register_module("tis_reinforce")
def tis_reinforce(
    *,
    logprob: torch.Tensor,  # [B, R] log pi_theta of the sampled tokens
    old_logprob: torch.Tensor,  # [B, R] log pi of the policy that sampled them
    advantages: torch.Tensor,  # [B, R]
    action_mask: torch.Tensor,  # [B, R] 1 on trained tokens
    params: TISParams,
    num_tokens: torch.Tensor | None = None,  # whole-batch normalisers from the trainer
    num_seqs: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """REINFORCE with a truncated importance weight min(ratio, C), no clipping of the update.

    loss_t = -min(exp(logprob - old_logprob), C).detach() * A_t * logprob_t
    (truncated importance sampling, Ionides 2008; used for off-policy rollouts by
    Yao et al. 2025, "Your efficient RL framework secretly brings you off-policy RL training").
    """
    weight = torch.exp(logprob - old_logprob).clamp(max=params.truncation).detach()
    loss_BR = -weight * advantages * logprob
    loss = aggregate(loss_BR, action_mask, params.loss_agg_mode, num_tokens=num_tokens, num_seqs=num_seqs)
    mask = action_mask.bool()
    truncated = ((torch.exp(logprob - old_logprob) > params.truncation) & mask).sum() / mask.sum().clamp(min=1)
    return loss, {"tis/truncated_frac": float(truncated)}


ALGORITHM_TYPE.register_module(
    "grpo_tis",
    module=AlgorithmType(
        description="GRPO advantages with the truncated-importance-sampling REINFORCE loss (example plugin).",
        policy_loss="tis_reinforce",
        advantage="grpo",
    ),
)
