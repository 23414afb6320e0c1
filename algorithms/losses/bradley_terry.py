"""Bradley-Terry reward-model loss: the chosen response should score higher than the rejected one.

    L = -log sigmoid(r_chosen - r_rejected)                  InstructGPT eq. 1

Bradley & Terry 1952, "Rank analysis of incomplete block designs", Biometrika 39;
as a reward-model objective: Ouyang et al. 2022, arXiv:2203.02155, sec. 3.5.

``scores [2B]`` is the reward model's scalar head read at each row's last non-pad token,
pairs interleaved: pair i's chosen response in row 2i, its rejected one in row 2i + 1 (so
any even split of the rows holds whole pairs). ``num_seqs``: the whole batch's rows (2 per
pair). With ``action_mask``, a pair whose rows are fully masked (padding that evens out
data-parallel shards) counts for nothing.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from trinity_like.ops import Number, safe_div
from trinity_like.registry import POLICY_LOSS_FN


@POLICY_LOSS_FN.register_module("bradley_terry")
def bradley_terry_loss(
    *,
    scores: torch.Tensor,  # [2B] scalar reward of each row: rows 2i (chosen) and 2i + 1 (rejected)
    num_seqs: Number | None = None,
    action_mask: torch.Tensor | None = None,  # [2B, R]: which rows are real
) -> tuple[torch.Tensor, dict[str, float]]:
    """Bradley-Terry reward-model loss -log sigmoid(r_chosen - r_rejected)."""
    rows = scores.shape[0]
    if rows % 2:
        raise ValueError(f"bradley_terry: a pair batch has an even number of rows; got {rows}")
    margin_B = scores[0::2] - scores[1::2]
    if action_mask is None:
        valid_B = torch.ones_like(margin_B, dtype=torch.bool)
    else:
        valid_B = (action_mask[0::2].sum(-1) + action_mask[1::2].sum(-1)) > 0
    loss = safe_div((-F.logsigmoid(margin_B) * valid_B).sum(), rows // 2 if num_seqs is None else num_seqs / 2)
    n = int(valid_B.sum())
    margin_B = margin_B.detach()[valid_B]
    return loss, {
        "accuracy": ((margin_B > 0).float().sum() / max(n, 1)).item(),
        "margin": (margin_B.sum() / max(n, 1)).item(),
    }
