"""Tensor operations every loss and advantage fn shares: masked reductions, the five loss
aggregation modes, group statistics, and the KL term / KL reward shaping the trainer adds.

Core code, so third-party plugins use exactly what the first-party ``algorithms`` pack uses.
Letters: B rows, R response columns, T all columns.

**Masks are per-token weights.** ``action_mask [B, R]`` is 1 on a trained token and 0 on
padding; a value in (0, 1) down-weights a token (the ``staleness`` sample strategy does
this to stale rows). Sums weight each token by its mask value; the *denominators* of the
aggregation modes count tokens (mask > 0) and sequences (rows with a token), so a weight
scales its token's share of the loss and is never normalised away.

**Micro-batches add up.** When the trainer passes the whole batch's normalisers
(``num_tokens``, ``num_seqs``; see :func:`normalizers`) they replace the local
denominators, and the losses of the micro-batches of a batch sum to the full-batch loss
in every mode (verl passes its global batch info to ``agg_loss`` for the same reason).

>>> loss = torch.tensor([[1.0, 3.0, 9.0], [2.0, 0.0, 0.0]])
>>> mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
>>> aggregate(loss, mask, "token-mean").item()      # (1 + 3 + 2) / 3 tokens
2.0
>>> aggregate(loss, mask, "seq-mean-token-mean").item()   # mean(2, 2)
2.0
>>> aggregate(loss, mask, "seq-mean-token-sum").item()    # mean(4, 2)
3.0
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, get_args

import torch

AggMode = Literal[
    "token-mean",  # sum over tokens / number of tokens (verl's default)
    "token-sum",  # sum over tokens: Tinker's semantics; the caller scales
    "seq-mean-token-sum",  # sum over each sequence's tokens, mean over sequences
    "seq-mean-token-mean",  # mean over each sequence's tokens, mean over sequences (GRPO paper)
    "seq-mean-token-sum-norm",  # seq-mean-token-sum / a constant length (Dr.GRPO, arXiv:2503.20783)
]
AGG_MODES: tuple[str, ...] = get_args(AggMode)

Number = float | int | torch.Tensor


# -- masked reductions -----------------------------------------------------------------
def masked_sum(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Sum of ``x * mask``; entries where the mask is 0 count as 0 even if ``x`` is NaN/inf there."""
    weighted = torch.where(mask != 0, x * mask, torch.zeros((), dtype=x.dtype, device=x.device))
    return weighted.sum() if dim is None else weighted.sum(dim)


def safe_div(num: torch.Tensor, den: Number) -> torch.Tensor:
    """``num / den``, and 0 where ``den`` is 0 (an empty mask has mean 0, never NaN)."""
    den = torch.as_tensor(den, dtype=num.dtype, device=num.device)
    return torch.where(den != 0, num / torch.where(den != 0, den, torch.ones_like(den)), torch.zeros_like(num))


def masked_mean(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Mean of ``x`` weighted by ``mask`` (0 for an empty mask)."""
    mask = mask.to(x.dtype)
    den = mask.sum() if dim is None else mask.sum(dim)
    return safe_div(masked_sum(x, mask, dim), den)


def masked_var(x: torch.Tensor, mask: torch.Tensor, unbiased: bool = True) -> torch.Tensor:
    """Variance of the masked entries of ``x`` (over all dims); 0 when fewer than two."""
    mask = mask.to(x.dtype)
    centered = x - masked_mean(x, mask)
    var = masked_mean(centered**2, mask)
    if unbiased:
        n = mask.sum()
        var = safe_div(var * n, n - 1)
    return var


def masked_whiten(x: torch.Tensor, mask: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """``(x - mean) / sqrt(var + eps)`` with mean and unbiased variance over the mask."""
    return (x - masked_mean(x, mask)) * torch.rsqrt(masked_var(x, mask) + eps)


# -- loss aggregation ------------------------------------------------------------------
def normalizers(mask_BR: torch.Tensor, is_expert_B: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
    """The global normalisers of a batch: ``num_tokens`` (mask > 0) and ``num_seqs`` (rows with a token).

    The trainer computes them once on the whole batch and passes them to every micro-batch.
    With ``is_expert`` (MIX batches) also ``num_expert_tokens`` and ``num_expert_seqs``.
    """
    tokens_B = (mask_BR > 0).sum(-1)
    out = {"num_tokens": tokens_B.sum(), "num_seqs": (tokens_B > 0).sum()}
    if is_expert_B is not None:
        expert_tokens_B = torch.where(is_expert_B.bool(), tokens_B, 0)
        out.update(num_expert_tokens=expert_tokens_B.sum(), num_expert_seqs=(expert_tokens_B > 0).sum())
    return out


def aggregate(
    loss_BR: torch.Tensor,
    mask_BR: torch.Tensor,
    mode: str,
    *,
    num_tokens: Number | None = None,
    num_seqs: Number | None = None,
    loss_scale_factor: float | None = None,
) -> torch.Tensor:
    """Reduce a per-token loss ``[B, R]`` to a scalar in one of :data:`AGG_MODES`.

    ``num_tokens`` / ``num_seqs``: the whole batch's counts (see :func:`normalizers`),
    replacing this micro-batch's own. ``loss_scale_factor``: the constant length
    ``seq-mean-token-sum-norm`` divides by (Dr.GRPO); None uses the response width R.
    """
    tokens_B = (mask_BR > 0).sum(-1)
    if mode == "token-sum":
        return masked_sum(loss_BR, mask_BR)
    if mode == "token-mean":
        return safe_div(masked_sum(loss_BR, mask_BR), tokens_B.sum() if num_tokens is None else num_tokens)
    if mode not in AGG_MODES:
        raise ValueError(f"unknown loss_agg_mode {mode!r}; modes: {', '.join(AGG_MODES)}")
    seq_B = masked_sum(loss_BR, mask_BR, dim=-1)
    if mode == "seq-mean-token-mean":
        seq_B = safe_div(seq_B, tokens_B)
    seqs = (tokens_B > 0).sum() if num_seqs is None else num_seqs
    loss = safe_div(seq_B.sum(), seqs)
    if mode == "seq-mean-token-sum-norm":
        loss = loss / (loss_scale_factor or mask_BR.shape[-1])
    return loss


@dataclass(frozen=True)
class AggParams:
    """Params every token-level loss shares: how its per-token loss becomes a scalar."""

    loss_agg_mode: AggMode = "token-mean"  # see trinity_like.ops.AGG_MODES
    loss_scale_factor: float | None = None  # seq-mean-token-sum-norm's divisor (Dr.GRPO); None: width R

    def aggregate(
        self,
        loss_BR: torch.Tensor,
        mask_BR: torch.Tensor,
        *,
        num_tokens: Number | None = None,
        num_seqs: Number | None = None,
    ) -> torch.Tensor:
        """:func:`aggregate` with this object's mode and scale factor."""
        return aggregate(
            loss_BR,
            mask_BR,
            self.loss_agg_mode,
            num_tokens=num_tokens,
            num_seqs=num_seqs,
            loss_scale_factor=self.loss_scale_factor,
        )


def ratio_metrics(log_ratio_BR: torch.Tensor, mask_BR: torch.Tensor) -> dict[str, float]:
    """KL between the old (sampling) and the new policy, from ``log(pi / pi_old)`` per token.

    ``ppo_kl``: mean of ``-log_ratio`` (k1, as verl reports it); ``approx_kl``: mean of
    ``ratio - 1 - log_ratio`` (k3: unbiased and never negative; Schulman, "Approximating KL
    divergence", 2020).
    """
    log_ratio = log_ratio_BR.detach()
    return {
        "ppo_kl": masked_mean(-log_ratio, mask_BR).item(),
        "approx_kl": masked_mean(torch.expm1(log_ratio) - log_ratio, mask_BR).item(),
    }


# -- groups ------------------------------------------------------------------------------
def group_stats(values_B: torch.Tensor, group_index_B: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-row ``(mean, unbiased std, size)`` of the row's group; rows sharing an index form a group.

    A group of one has std 0. Indices need not be contiguous.
    """
    _, inverse = torch.unique(group_index_B, return_inverse=True)
    num_groups = int(inverse.max()) + 1 if inverse.numel() else 0
    zeros = values_B.new_zeros(num_groups)
    count_G = zeros.index_add(0, inverse, torch.ones_like(values_B))
    mean_G = zeros.index_add(0, inverse, values_B) / count_G
    sq_G = zeros.index_add(0, inverse, (values_B - mean_G[inverse]) ** 2)
    std_G = (sq_G / (count_G - 1).clamp_min(1)).sqrt()
    return mean_G[inverse], std_G[inverse], count_G[inverse]


def groups_with_signal(
    values_B: torch.Tensor, group_index_B: torch.Tensor, *, baseline: float | None = None
) -> torch.Tensor:
    """Bool ``[B]``: rows whose group carries a signal, the one test of every loop's group filter.

    A group whose samples all scored the same has zero group-relative advantage and teaches
    nothing; DAPO (arXiv:2503.14476, sec. 3.2) drops it and samples more. With ``baseline``
    None a group carries a signal when its ``values`` (rewards) are not all equal (the recipe
    loop's dynamic sampling, before advantages); with a ``baseline`` when they are not all
    equal to it (the client loop, on the advantages its estimator gave: 0 is nothing to learn;
    a NaN there is not 0).
    """
    _, inverse = torch.unique(group_index_B, return_inverse=True)
    num_groups = int(inverse.max()) + 1 if inverse.numel() else 0
    hi = values_B.new_full((num_groups,), -torch.inf).scatter_reduce(0, inverse, values_B, "amax")
    lo = values_B.new_full((num_groups,), torch.inf).scatter_reduce(0, inverse, values_B, "amin")
    signal_G = hi > lo if baseline is None else (hi != baseline) | (lo != baseline)
    return signal_G[inverse]


def kept_groups(groups: Sequence[Sequence[float]], *, baseline: float | None = None) -> list[bool]:
    """:func:`groups_with_signal` over groups given as lists of values: one flag per group (an
    empty group carries none).

    >>> kept_groups([[1.0, 1.0], [0.0, 1.0], []]), kept_groups([[0.0, 0.0], [0.5, 0.5]], baseline=0.0)
    ([False, True, False], [False, True])
    """
    values = torch.tensor([v for group in groups for v in group], dtype=torch.float64)
    index_B = torch.tensor([g for g, group in enumerate(groups) for _ in group], dtype=torch.long)
    signal_B = groups_with_signal(values, index_B, baseline=baseline).tolist()
    keep = [False] * len(groups)
    for g, signal in zip(index_B.tolist(), signal_B, strict=True):
        keep[g] = signal
    return keep


def last_token_index(mask_BT: torch.Tensor) -> torch.Tensor:
    """Index ``[B]`` of each row's last position with mask > 0 (0 for an empty row)."""
    positions = torch.arange(mask_BT.shape[-1], device=mask_BT.device)
    return torch.where(mask_BT > 0, positions, 0).amax(-1)


def token_level_rewards(rewards_B: torch.Tensor, action_mask_BR: torch.Tensor) -> torch.Tensor:
    """Sequence scores placed on each row's last response token: ``[B] -> [B, R]``."""
    out = torch.zeros(action_mask_BR.shape, dtype=rewards_B.dtype, device=rewards_B.device)
    return out.scatter(-1, last_token_index(action_mask_BR).unsqueeze(-1), rewards_B.unsqueeze(-1))


# -- KL as a loss term or as reward shaping ---------------------------------------------
def kl_loss_term(
    kl_BR: torch.Tensor,
    action_mask_BR: torch.Tensor,
    *,
    coef: float,
    loss_agg_mode: str = "token-mean",
    num_tokens: Number | None = None,
    num_seqs: Number | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """``coef * aggregate(kl)``: KL to the reference as a loss term (GRPO's beta * D_KL).

    ``coef == 0`` gives an exact zero that does not depend on ``kl`` at all.
    """
    metrics = {"kl": masked_mean(kl_BR.detach(), action_mask_BR).item(), "kl_coef": float(coef)}
    if coef == 0:
        return kl_BR.new_zeros(()), metrics
    loss = aggregate(kl_BR, action_mask_BR, loss_agg_mode, num_tokens=num_tokens, num_seqs=num_seqs)
    return coef * loss, metrics


def apply_kl_penalty(
    token_level_rewards_BR: torch.Tensor,
    kl_BR: torch.Tensor,
    action_mask_BR: torch.Tensor,
    *,
    coef: float,
) -> tuple[torch.Tensor, dict[str, float]]:
    """``r_t - coef * kl_t`` on response tokens: KL as reward shaping, before advantages.

    The per-token penalty of InstructGPT (Ouyang et al. 2022, eq. 2) and REINFORCE++
    (arXiv:2501.03262). ``kl`` compares the *sampling* policy with the reference (the
    trainer passes ``old_logprob`` as the KL fn's ``logprob``). ``coef == 0`` returns the
    rewards unchanged.
    """
    metrics = {"kl_penalty": masked_mean(kl_BR.detach(), action_mask_BR).item(), "kl_penalty_coef": float(coef)}
    if coef == 0:
        return token_level_rewards_BR, metrics
    kl = torch.where(action_mask_BR != 0, kl_BR.detach(), torch.zeros_like(kl_BR))
    return token_level_rewards_BR - coef * kl, metrics
