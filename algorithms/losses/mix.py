"""MIX: the GRPO (PPO-clip) loss on rollout rows plus an SFT loss on expert rows, weighted by mu.

    L = (1 - mu) * L_ppo(rows with is_expert = False) + mu * L_sft(rows with is_expert = True)

Each part is aggregated over its own rows, so mu sets the balance whatever the fraction of
expert rows. Trinity-RFT's MIX algorithm (Pan et al. 2025, "Trinity-RFT", arXiv:2505.17826);
the idea of mixing expert NLL into RL goes back to InstructGPT's PPO-ptx (arXiv:2203.02155).

Micro-batches: with the whole batch's ``num_tokens`` / ``num_seqs`` the trainer must also
pass its expert counts ``num_expert_tokens`` / ``num_expert_seqs``
(``trinity_like.ops.normalizers(mask, is_expert=...)``); the rollout counts are the difference.
Then ``rl_loss`` and ``sft_loss`` (the two parts before weighting) are each micro-batch's
share of the whole batch's part, summed over micro-batches like every ``*_loss`` metric.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from algorithms.losses.ppo import PPOParams, ppo_loss
from algorithms.losses.sft import sft_loss
from trinity_like.ops import Number
from trinity_like.registry import POLICY_LOSS_FN


@dataclass(frozen=True)
class MixParams(PPOParams):
    mu: float = 0.1  # weight of the expert SFT loss; 1 - mu weighs the RL loss

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 0.0 <= self.mu <= 1.0:
            raise ValueError(f"mu must be in [0, 1], got {self.mu}")


def _part(total: Number | None, expert: Number | None, want_expert: bool) -> Number | None:
    if total is None:
        return None
    if expert is None:
        raise ValueError(
            "mix: the whole batch's normalisers were given without its expert counts "
            "(num_expert_tokens / num_expert_seqs; see trinity_like.ops.normalizers)"
        )
    return expert if want_expert else total - expert


@POLICY_LOSS_FN.register_module("mix")
def mix_loss(
    *,
    logprob: torch.Tensor,  # [B, R] log pi_theta
    old_logprob: torch.Tensor,  # [B, R] sampling logprobs (ignored on expert rows)
    advantages: torch.Tensor,  # [B, R] (ignored on expert rows)
    action_mask: torch.Tensor,  # [B, R]
    is_expert: torch.Tensor,  # [B] bool: expert (SFT) rows
    params: MixParams,
    num_tokens: Number | None = None,
    num_seqs: Number | None = None,
    num_expert_tokens: Number | None = None,
    num_expert_seqs: Number | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """MIX: (1 - mu) * GRPO loss on rollout rows + mu * SFT loss on expert rows (Trinity-RFT)."""
    expert_B1 = is_expert.bool().unsqueeze(-1)
    rl_mask = torch.where(expert_B1, torch.zeros_like(action_mask), action_mask)
    sft_mask = torch.where(expert_B1, action_mask, torch.zeros_like(action_mask))
    # Expert rows carry no sampling logprobs or advantages: neutral values keep them finite.
    old_logprob = torch.where(expert_B1, logprob.detach(), old_logprob)
    advantages = torch.where(expert_B1, torch.zeros_like(advantages), advantages)
    rl, rl_metrics = ppo_loss(
        logprob=logprob,
        old_logprob=old_logprob,
        advantages=advantages,
        action_mask=rl_mask,
        params=params,
        num_tokens=_part(num_tokens, num_expert_tokens, False),
        num_seqs=_part(num_seqs, num_expert_seqs, False),
    )
    sft, sft_metrics = sft_loss(
        logprob=logprob,
        action_mask=sft_mask,
        params=params,
        num_tokens=_part(num_tokens, num_expert_tokens, True),
        num_seqs=_part(num_seqs, num_expert_seqs, True),
    )
    loss = (1 - params.mu) * rl + params.mu * sft
    # rl_loss / sft_loss are shares of whole-batch totals (summed over micro-batches, see
    # trinity_like.trainer.base.mean_metrics); the other metrics are means over one part's
    # tokens, reported only by a micro-batch that holds some of that part.
    metrics = {"rl_loss": rl.item(), "sft_loss": sft.item()}
    if bool((rl_mask > 0).any()):
        metrics.update(rl_metrics)
    if bool((sft_mask > 0).any()):
        metrics.update({f"expert_{k}": v for k, v in sft_metrics.items()})
    # The whole batch's share of expert rows when its counts are given (the same in every micro-batch).
    if num_seqs is not None and num_expert_seqs is not None:
        metrics["expert_frac"] = float(num_expert_seqs) / max(float(num_seqs), 1.0)
    else:
        metrics["expert_frac"] = is_expert.float().mean().item()
    return loss, metrics
