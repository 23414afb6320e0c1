"""Rollout corrections (ROLLOUT_CORRECTION): the sampler-trainer gap turned into per-token weights and a mask.

The rollout engine samples with its own numerics (bf16, another kernel, older weights): its
logprob of a drawn token, log mu, is not the trainer's log pi_old. Every correction here reads
the per-token ratio

    rho_t = pi_old(y_t) / mu(y_t) = exp(old_logprob_t - rollout_logprob_t)

and returns ``(weights_BR, mask_BR, metrics)``: the objective multiplies the advantages by
``weights`` (detached, > 0 where kept) and the response mask by ``mask``, whichever policy
loss runs (``trinity_like.trainer.objective``). For a loss linear in the advantage that is
exactly an importance weight on each token's term. Sequence-level variants broadcast one value
over a row's response tokens. Each logs the fraction of tokens or sequences it truncated or
masked under ``rollout_corr/``.

Shapes: ``B`` rows, ``R`` response tokens (padded; ``action_mask [B, R]`` marks the real ones).

Sources (definitions learnt from, not copied): Yao et al. 2025, "Your Efficient RL Framework
Secretly Brings You Off-Policy RL Training" (fengyao.notion.site/off-policy-rl): token TIS and
masked IS (MIS); Liu, Li et al. 2025, "When Speed Kills Stability: Demystifying RL Collapse from
the Training-Inference Mismatch" (richardli.xyz/rl-collapse; verl's
github.com/volcengine/verl/blob/main/docs/algo/rollout_corr.md): sequence-level IS, sequence and
geometric-mean rejection; Ling Team 2025, "Every Step Evolves: Scaling Reinforcement Learning for
Trillion-Scale Thinking Model" (arXiv:2510.18855): IcePop.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from trinity_like.ops import masked_mean
from trinity_like.registry import ROLLOUT_CORRECTION

Correction = tuple[torch.Tensor, torch.Tensor, dict[str, float]]
_LOG_CLAMP = 20.0  # exp overflows float32 beyond ~88; ratios past e^20 are cut or masked anyway


def _log_rho(old_logprob: torch.Tensor, rollout_logprob: torch.Tensor, action_mask: torch.Tensor) -> torch.Tensor:
    """log rho_t in float64, detached, 0 on padding (so sums over a row see only its real tokens)."""
    log_rho = (old_logprob.detach().double() - rollout_logprob.detach().double()) * action_mask.double()
    return log_rho.clamp(-_LOG_CLAMP, _LOG_CLAMP)


def _seq_log_rho(log_rho_BR: torch.Tensor) -> torch.Tensor:
    """log of the sequence ratio prod_t rho_t: [B]."""
    return log_rho_BR.sum(-1).clamp(-_LOG_CLAMP, _LOG_CLAMP)


def _rows(action_mask: torch.Tensor) -> torch.Tensor:
    """[B] bool: the rows with at least one response token (the sequences a fraction counts)."""
    return action_mask.sum(-1) > 0


def _frac_tokens(flag_BR: torch.Tensor, action_mask: torch.Tensor) -> float:
    return float(masked_mean(flag_BR.double(), action_mask.double()))


def _frac_seqs(flag_B: torch.Tensor, action_mask: torch.Tensor) -> float:
    rows = _rows(action_mask)
    return float(flag_B[rows].double().mean()) if rows.any() else 0.0


def _out(
    weights_BR: torch.Tensor,
    keep_BR: torch.Tensor,
    action_mask: torch.Tensor,
    metrics: dict[str, float],
    dtype: torch.dtype,
) -> Correction:
    """Weights in the logprobs' dtype; the mask in the action mask's, 0 on padding as well."""
    mask_BR = keep_BR.to(action_mask.dtype) * action_mask
    metrics["rollout_corr/weight_mean"] = float(masked_mean(weights_BR.double(), (mask_BR > 0).double()))
    return weights_BR.to(dtype), mask_BR, metrics


@dataclass(frozen=True)
class CapParams:
    cap: float = 2.0  # C: the ratio is truncated (TIS) or its token/sequence masked (MIS) above C; Yao et al. use 2

    def __post_init__(self) -> None:
        if not self.cap > 0:
            raise ValueError(f"cap must be > 0, got {self.cap}")


@dataclass(frozen=True)
class BandParams:
    lower: float = 0.5  # a token/sequence whose ratio is below this is masked
    upper: float = 5.0  # ... or above this (IcePop's [0.5, 5])

    def __post_init__(self) -> None:
        if not 0 < self.lower < 1 < self.upper:
            raise ValueError(f"need 0 < lower < 1 < upper, got lower={self.lower}, upper={self.upper}")


@dataclass(frozen=True)
class GeoParams:
    # The per-token geometric mean of a row's ratios stays near 1: bf16 sampling against an fp32
    # trainer on SmolLM2-135M moves log rho by 0.037 per token on average (docs/precision.md),
    # mostly with both signs within a row. 5 % keeps such rows and drops ones whose tokens drift
    # one way (verl's 1.001 is for long responses where the mean averages many more tokens).
    lower: float = 0.95  # a row whose geometric-mean ratio is below this is masked
    upper: float = 1.05  # ... or above this

    def __post_init__(self) -> None:
        if not 0 < self.lower < 1 < self.upper:
            raise ValueError(f"need 0 < lower < 1 < upper, got lower={self.lower}, upper={self.upper}")


@ROLLOUT_CORRECTION.register_module("token_tis")
def token_tis(
    *,
    old_logprob: torch.Tensor,  # [B, R] log pi_old, the trainer's (proximal) policy
    rollout_logprob: torch.Tensor,  # [B, R] log mu, the sampler's logprob of the token it drew
    action_mask: torch.Tensor,  # [B, R] 1 on response tokens
    params: CapParams,
) -> Correction:
    """Token-level truncated IS: each token weighted by min(rho_t, C) (Yao et al. 2025)."""
    log_rho = _log_rho(old_logprob, rollout_logprob, action_mask)
    rho = log_rho.exp()
    weights = rho.clamp(max=params.cap)
    metrics = {"rollout_corr/truncated_token_frac": _frac_tokens(rho > params.cap, action_mask)}
    return _out(weights, torch.ones_like(action_mask), action_mask, metrics, old_logprob.dtype)


@ROLLOUT_CORRECTION.register_module("seq_tis")
def seq_tis(
    *,
    old_logprob: torch.Tensor,  # [B, R]
    rollout_logprob: torch.Tensor,  # [B, R]
    action_mask: torch.Tensor,  # [B, R]
    params: CapParams,
) -> Correction:
    """Sequence-level truncated IS: every token of a row weighted by min(prod_t rho_t, C) (Liu, Li et al. 2025)."""
    seq_rho = _seq_log_rho(_log_rho(old_logprob, rollout_logprob, action_mask)).exp()  # [B]
    weights = seq_rho.clamp(max=params.cap).unsqueeze(-1).expand_as(action_mask)
    metrics = {"rollout_corr/truncated_seq_frac": _frac_seqs(seq_rho > params.cap, action_mask)}
    return _out(weights, torch.ones_like(action_mask), action_mask, metrics, old_logprob.dtype)


@ROLLOUT_CORRECTION.register_module("token_mis")
def token_mis(
    *,
    old_logprob: torch.Tensor,  # [B, R]
    rollout_logprob: torch.Tensor,  # [B, R]
    action_mask: torch.Tensor,  # [B, R]
    params: CapParams,
) -> Correction:
    """Token-level masked IS: weight rho_t, tokens with rho_t > C masked out (Yao et al. 2025, MIS)."""
    rho = _log_rho(old_logprob, rollout_logprob, action_mask).exp()
    over = rho > params.cap
    metrics = {"rollout_corr/masked_token_frac": _frac_tokens(over, action_mask)}
    return _out(rho, ~over, action_mask, metrics, old_logprob.dtype)


@ROLLOUT_CORRECTION.register_module("seq_mis")
def seq_mis(
    *,
    old_logprob: torch.Tensor,  # [B, R]
    rollout_logprob: torch.Tensor,  # [B, R]
    action_mask: torch.Tensor,  # [B, R]
    params: CapParams,
) -> Correction:
    """Sequence-level masked IS: weight prod_t rho_t, rows whose product exceeds C masked out (Yao et al. 2025)."""
    seq_rho = _seq_log_rho(_log_rho(old_logprob, rollout_logprob, action_mask)).exp()  # [B]
    over = seq_rho > params.cap
    weights = seq_rho.unsqueeze(-1).expand_as(action_mask)
    metrics = {"rollout_corr/masked_seq_frac": _frac_seqs(over, action_mask)}
    return _out(weights, (~over).unsqueeze(-1).expand_as(action_mask), action_mask, metrics, old_logprob.dtype)


@ROLLOUT_CORRECTION.register_module("geo_mask")
def geo_mask(
    *,
    old_logprob: torch.Tensor,  # [B, R]
    rollout_logprob: torch.Tensor,  # [B, R]
    action_mask: torch.Tensor,  # [B, R]
    params: GeoParams,
) -> Correction:
    """Geometric-mean sequence masking: rows whose (prod_t rho_t)^(1/T) leaves [lower, upper] masked, weight 1."""
    log_rho = _log_rho(old_logprob, rollout_logprob, action_mask)
    length = action_mask.double().sum(-1).clamp(min=1.0)
    geo = (log_rho.sum(-1) / length).exp()  # [B]
    out = (geo < params.lower) | (geo > params.upper)
    metrics = {"rollout_corr/masked_seq_frac": _frac_seqs(out, action_mask)}
    return _out(
        torch.ones_like(log_rho), (~out).unsqueeze(-1).expand_as(action_mask), action_mask, metrics, old_logprob.dtype
    )


@ROLLOUT_CORRECTION.register_module("icepop")
def icepop(
    *,
    old_logprob: torch.Tensor,  # [B, R]
    rollout_logprob: torch.Tensor,  # [B, R]
    action_mask: torch.Tensor,  # [B, R]
    params: BandParams,
) -> Correction:
    """IcePop: weight rho_t, tokens whose rho_t leaves [lower, upper] masked (Ling Team 2025, arXiv:2510.18855)."""
    rho = _log_rho(old_logprob, rollout_logprob, action_mask).exp()
    out = (rho < params.lower) | (rho > params.upper)
    metrics = {"rollout_corr/masked_token_frac": _frac_tokens(out, action_mask)}
    return _out(rho, ~out, action_mask, metrics, old_logprob.dtype)
