"""DPO: a logistic loss on how much more the policy prefers the chosen response than the reference does.

    z = beta * [ (log pi(y_c) - log ref(y_c)) - (log pi(y_r) - log ref(y_r)) ]
    L = -(1 - eps) log sigmoid(z) - eps log sigmoid(-z)                   DPO eq. 7

log pi(y) sums the response tokens' logprobs. Rafailov et al. 2023, "Direct Preference
Optimization", arXiv:2305.18290; eps > 0 is the conservative DPO of Mitchell 2023, "A
note on DPO with noisy preferences" (label smoothing).

Pair layout: a batch of B pairs is 2B interleaved rows, pair i's chosen response in row
2i and its rejected one in row 2i + 1, so any split of the rows at even boundaries (the
engines' micro-batches and data-parallel shards) holds whole pairs. ``num_seqs`` is the
whole batch's row count (2 per pair). A pair whose rows are fully masked (padding added
to even out data-parallel shards) counts for nothing.
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
    logprob: torch.Tensor,  # [2B, R] policy logprobs, rows 2i (chosen) and 2i + 1 (rejected)
    ref_logprob: torch.Tensor,  # [2B, R] reference logprobs, same layout
    action_mask: torch.Tensor,  # [2B, R]
    params: DPOParams,
    num_seqs: Number | None = None,  # the whole batch's rows (2 per pair)
) -> tuple[torch.Tensor, dict[str, float]]:
    """DPO: sigmoid loss on policy-vs-reference log-ratios of chosen and rejected (Rafailov et al. 2023)."""
    rows = logprob.shape[0]
    if rows % 2:
        raise ValueError(f"dpo: a pair batch has an even number of rows (chosen, rejected per pair); got {rows}")
    log_ratio_2B = masked_sum(logprob - ref_logprob, action_mask, dim=-1)
    reward_c, reward_r = params.beta * log_ratio_2B[0::2], params.beta * log_ratio_2B[1::2]
    valid_B = (action_mask[0::2].sum(-1) + action_mask[1::2].sum(-1)) > 0
    z = reward_c - reward_r
    eps = params.label_smoothing
    loss_B = (-(1 - eps) * F.logsigmoid(z) - eps * F.logsigmoid(-z)) * valid_B
    loss = safe_div(loss_B.sum(), rows // 2 if num_seqs is None else num_seqs / 2)
    n = int(valid_B.sum())
    if n == 0:
        return loss, {}
    z, reward_c, reward_r = z.detach()[valid_B], reward_c.detach()[valid_B], reward_r.detach()[valid_B]
    return loss, {
        "reward_margin": (z.sum() / n).item(),
        "reward_accuracy": ((z > 0).float().sum() / n).item(),
        "reward_chosen": (reward_c.sum() / n).item(),
        "reward_rejected": (reward_r.sum() / n).item(),
    }
