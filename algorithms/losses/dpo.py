"""DPO: a logistic loss on how much more the policy prefers the chosen response than the reference does.

    z = beta * [ (log pi(y_c) - log ref(y_c)) - (log pi(y_r) - log ref(y_r)) ]
    L = -(1 - eps) log sigmoid(z) - eps log sigmoid(-z)                   DPO eq. 7

log pi(y) sums the response tokens' logprobs. Rafailov et al. 2023, "Direct Preference
Optimization", arXiv:2305.18290; eps > 0 is the conservative DPO of Mitchell 2023, "A
note on DPO with noisy preferences" (label smoothing).

Pair layout: a batch of B pairs is 2B rows, the B chosen rows first (rows 0..B-1), then
the B rejected rows in the same order (rows B..2B-1). A micro-batch must hold whole pairs
in that layout; ``num_seqs`` is then the whole batch's row count (2 per pair).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from trinity_like.ops import Number, masked_sum, safe_div
from trinity_like.registry import POLICY_LOSS_FN


@dataclass(frozen=True)
class DPOParams:
    beta: float = 0.1  # inverse temperature of the implicit reward beta * log(pi / ref)
    label_smoothing: float = 0.0  # eps: assumed probability that a preference label is flipped

    def __post_init__(self) -> None:
        if not 0.0 <= self.label_smoothing < 0.5:
            raise ValueError(f"label_smoothing must be in [0, 0.5), got {self.label_smoothing}")


@POLICY_LOSS_FN.register_module("dpo")
def dpo_loss(
    *,
    logprob: torch.Tensor,  # [2B, R] policy logprobs, chosen rows then rejected rows
    ref_logprob: torch.Tensor,  # [2B, R] reference logprobs, same layout
    action_mask: torch.Tensor,  # [2B, R]
    params: DPOParams,
    num_seqs: Number | None = None,  # the whole batch's rows (2 per pair)
) -> tuple[torch.Tensor, dict[str, float]]:
    """DPO: sigmoid loss on policy-vs-reference log-ratios of chosen and rejected (Rafailov et al. 2023)."""
    rows = logprob.shape[0]
    if rows % 2:
        raise ValueError(f"dpo: a pair batch has an even number of rows (chosen, then rejected); got {rows}")
    log_ratio_2B = masked_sum(logprob - ref_logprob, action_mask, dim=-1)
    reward_c, reward_r = (params.beta * log_ratio_2B).chunk(2)
    z = reward_c - reward_r
    eps = params.label_smoothing
    loss_B = -(1 - eps) * F.logsigmoid(z) - eps * F.logsigmoid(-z)
    loss = safe_div(loss_B.sum(), rows // 2 if num_seqs is None else num_seqs / 2)
    z, reward_c, reward_r = z.detach(), reward_c.detach(), reward_r.detach()
    n = max(rows // 2, 1)
    return loss, {
        "reward_margin": (z.sum() / n).item(),
        "reward_accuracy": ((z > 0).float().sum() / n).item(),
        "reward_chosen": (reward_c.sum() / n).item(),
        "reward_rejected": (reward_r.sum() / n).item(),
    }
