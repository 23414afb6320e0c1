"""PPO with a truncated importance weight on the sampler/learner mismatch (decoupled PPO + TIS).

Kept as a shorthand: ``policy_loss: ppo_tis`` is ``policy_loss: ppo`` with
``rollout_correction: token_tis`` (the same function computes the weight,
``algorithms/rollout_correction.py``); the rollout-correction slot applies it, or any other
correction, to every policy loss.

    w_t  = min(exp(old_logprob_t - rollout_logprob_t), C)          detached
    L_t  = w_t * max(-A_t r_t, -A_t clip(r_t, 1 - eps_low, 1 + eps_high)),   r_t = exp(logprob_t - old_logprob_t)

``rollout_logprob`` is the sampler's logprob of the token it drew (the behaviour policy
mu), ``old_logprob`` the learner's proximal policy: the PPO ratio keeps the update close to
pi_old and ``w`` corrects for the tokens having been drawn from mu, not pi_old -- a stale
sampler (off-by-K async), or a sampling engine whose numerics differ from the learner's.
Truncating w at C bounds the variance a rare token with a huge ratio would bring; the bias
it leaves is small when mu is close to pi_old. Since w > 0, ``L = ppo(A * w)`` exactly.

On-policy (the recipe's ``old_logprob`` is the current weights, taken without a second
forward; the client, whose every datum gets exactly one update) the ratio r is 1 at the
forward and its gradient is ``-A w grad log pi``: a policy gradient weighted by the
truncated ratio pi / mu.

Yao et al. 2025, "Your Efficient RL Framework Secretly Brings You Off-Policy RL Training"
(fengyao.notion.site/off-policy-rl): truncated importance sampling, C = 2; verl's rollout
correction (``rollout_is``, token level). Espeholt et al. 2018, "IMPALA", arXiv:1802.01561:
truncated importance weights. Hilton et al. 2021, "Batch size-invariance for policy
optimization", arXiv:2110.00641: the decoupled proximal/behaviour policy objective.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from algorithms.losses.ppo import PPOParams, ppo_loss
from algorithms.rollout_correction import CapParams, token_tis
from trinity_like.ops import Number
from trinity_like.registry import POLICY_LOSS_FN


@dataclass(frozen=True)
class TISParams(PPOParams):
    tis_cap: float = 2.0  # C: the importance weight pi_old / mu is truncated at C (Yao et al. use 2)

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.tis_cap > 0:
            raise ValueError(f"tis_cap must be > 0, got {self.tis_cap}")


@POLICY_LOSS_FN.register_module("ppo_tis")
def ppo_tis_loss(
    *,
    logprob: torch.Tensor,  # [B, R] log pi_theta
    old_logprob: torch.Tensor,  # [B, R] log pi_old, the proximal policy
    rollout_logprob: torch.Tensor,  # [B, R] log mu, the sampler's logprob of the token it drew
    advantages: torch.Tensor,  # [B, R]
    action_mask: torch.Tensor,  # [B, R]
    params: TISParams,
    num_tokens: Number | None = None,
    num_seqs: Number | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """PPO's clipped surrogate, each token's advantage weighted by min(pi_old / mu, C)."""
    weight, _, corr = token_tis(
        old_logprob=old_logprob,
        rollout_logprob=rollout_logprob,
        action_mask=action_mask,
        params=CapParams(params.tis_cap),
    )
    loss, metrics = ppo_loss(
        logprob=logprob,
        old_logprob=old_logprob,
        advantages=advantages * weight,
        action_mask=action_mask,
        params=params,
        num_tokens=num_tokens,
        num_seqs=num_seqs,
    )
    metrics["tis_weight_mean"] = corr["rollout_corr/weight_mean"]
    metrics["tis_truncated_frac"] = corr["rollout_corr/truncated_token_frac"]
    return loss, metrics
