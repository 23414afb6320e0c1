"""Bradley-Terry reward-model loss: the chosen response should score higher than the rejected one.

    L = -log sigmoid(r_chosen - r_rejected)                  InstructGPT eq. 1

Bradley & Terry 1952, "Rank analysis of incomplete block designs", Biometrika 39;
as a reward-model objective: Ouyang et al. 2022, arXiv:2203.02155, sec. 3.5.

``scores [2B]`` is the reward model's scalar head read at each row's last non-pad token:
the B chosen rows first, then the B rejected rows in the same order. ``num_seqs``: the
whole batch's rows (2 per pair).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from trinity_like.ops import Number, safe_div
from trinity_like.registry import POLICY_LOSS_FN


@POLICY_LOSS_FN.register_module("bradley_terry")
def bradley_terry_loss(
    *,
    scores: torch.Tensor,  # [2B] scalar reward of each row, chosen rows then rejected rows
    num_seqs: Number | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Bradley-Terry reward-model loss -log sigmoid(r_chosen - r_rejected)."""
    rows = scores.shape[0]
    if rows % 2:
        raise ValueError(f"bradley_terry: a pair batch has an even number of rows; got {rows}")
    chosen_B, rejected_B = scores.chunk(2) if rows else (scores, scores)
    margin_B = chosen_B - rejected_B
    loss = safe_div(-F.logsigmoid(margin_B).sum(), rows // 2 if num_seqs is None else num_seqs / 2)
    n = max(rows // 2, 1)
    margin_B = margin_B.detach()
    return loss, {
        "accuracy": ((margin_B > 0).float().sum() / n).item(),
        "margin": (margin_B.sum() / n).item(),
    }
