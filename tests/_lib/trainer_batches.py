"""Batches in the engine layout and hand-written loss callables shared by the trainer tests.

The losses are written out here on purpose (not imported from ``algorithms``): the
engines are tested against the plain formulas, independently of the algorithm pack.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch


def make_batch(vocab_size: int, rows: int, prompt_len: int, response_len: int, seed: int) -> dict[str, torch.Tensor]:
    """A random batch: prompts left-padded to P, responses right-padded to R, ragged lengths.

    Every row has at least one prompt and one response token; a few response tokens inside
    the real response are masked out of the loss (as multi-turn masking does).
    """
    g = torch.Generator().manual_seed(seed)
    prompt_lens = torch.randint(1, prompt_len + 1, (rows,), generator=g)
    response_lens = torch.randint(1, response_len + 1, (rows,), generator=g)
    prompt_lens[0], response_lens[0] = prompt_len, response_len  # one row with no padding at all
    ids = torch.randint(3, vocab_size, (rows, prompt_len + response_len), generator=g)
    cols_p, cols_r = torch.arange(prompt_len), torch.arange(response_len)
    prompt_mask = cols_p.unsqueeze(0) >= (prompt_len - prompt_lens).unsqueeze(1)
    response_attn = cols_r.unsqueeze(0) < response_lens.unsqueeze(1)
    attention_mask = torch.cat([prompt_mask, response_attn], dim=1).long()
    ids = ids.masked_fill(attention_mask == 0, 0)
    position_ids = (attention_mask.cumsum(1) - 1).clamp(min=0)
    dropped = torch.rand(rows, response_len, generator=g) < 0.15
    dropped[:, 0] = False
    response_mask = (response_attn & ~dropped).float()
    return {
        "input_ids": ids,
        "attention_mask": attention_mask,
        "position_ids": position_ids,
        "response_mask": response_mask,
        "old_logprob": -torch.rand(rows, response_len, generator=g) * 3 - 1.0,
        "advantages": torch.randn(rows, response_len, generator=g),
    }


def naive_outputs(model: torch.nn.Module, batch: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Oracle: full forward, ``log_softmax`` over every position, then the response columns."""
    logits = model(
        input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], position_ids=batch["position_ids"]
    ).logits.float()
    response_len = batch["response_mask"].shape[1]
    logp_BRV = torch.log_softmax(logits[:, -response_len - 1 : -1], dim=-1)
    targets = batch["input_ids"][:, -response_len:]
    return {
        "logprob": logp_BRV.gather(-1, targets.unsqueeze(-1)).squeeze(-1),
        "entropy": -(logp_BRV.exp() * logp_BRV).sum(-1),
    }


def nll_loss(outputs: Mapping[str, torch.Tensor], batch: Mapping[str, torch.Tensor]):
    """Token-mean negative log-likelihood over the whole batch: -sum(mask * logprob) / num_tokens."""
    mask = batch["response_mask"]
    loss = -(outputs["logprob"] * mask).sum() / batch["num_tokens"]
    return loss, {"nll_tokens": float(mask.sum())}


class ClippedPPOLoss:
    """PPO's clipped surrogate (Schulman et al., 2017), token-mean, minus an entropy bonus."""

    def __init__(self, clip: float = 0.2, entropy_coef: float = 0.0) -> None:
        self.clip = clip
        self.entropy_coef = entropy_coef

    def __call__(self, outputs: Mapping[str, torch.Tensor], batch: Mapping[str, torch.Tensor]):
        mask = batch["response_mask"]
        ratio = torch.exp(outputs["logprob"] - batch["old_logprob"])
        adv = batch["advantages"]
        surrogate = torch.minimum(ratio * adv, ratio.clamp(1 - self.clip, 1 + self.clip) * adv)
        loss = -(surrogate * mask).sum() / batch["num_tokens"]
        if self.entropy_coef:
            loss = loss - self.entropy_coef * (outputs["entropy"] * mask).sum() / batch["num_tokens"]
        clipped = ((ratio - 1).abs() > self.clip).float()
        return loss, {"clipfrac": float((clipped * mask).sum() / mask.sum().clamp(min=1))}


def value_mse_loss(outputs: Mapping[str, torch.Tensor], batch: Mapping[str, torch.Tensor]):
    """Token-mean squared error of values against returns (here: the advantages field)."""
    mask = batch["response_mask"]
    return ((outputs["values"] - batch["advantages"]) ** 2 * mask).sum() / batch["num_tokens"], {}
