"""Supervised fine-tuning: masked negative log-likelihood of the response tokens.

    L = aggregate(-logprob_t over response tokens)

The maximum-likelihood objective of instruction tuning (Ouyang et al. 2022, "Training
language models to follow instructions with human feedback", arXiv:2203.02155, sec. 3.5).
"""

from __future__ import annotations

import torch

from trinity_like.ops import AggParams, Number, masked_mean
from trinity_like.registry import POLICY_LOSS_FN


@POLICY_LOSS_FN.register_module("sft")
def sft_loss(
    *,
    logprob: torch.Tensor,  # [B, R] log pi_theta of the target tokens
    action_mask: torch.Tensor,  # [B, R] 1 on tokens trained on
    params: AggParams,
    num_tokens: Number | None = None,
    num_seqs: Number | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Supervised fine-tuning: masked negative log-likelihood."""
    loss = params.aggregate(-logprob, action_mask, num_tokens=num_tokens, num_seqs=num_seqs)
    return loss, {"nll": masked_mean(-logprob.detach(), action_mask).item()}
