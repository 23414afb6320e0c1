"""From rewards to per-token advantages, with optional KL reward shaping and dynamic sampling.

These run on the trainer side where the whole batch (and so every group) is known:

1. KL shaping (algorithm slot ``kl_penalty``): ``r_t - coef * KL_t(sampler || ref)`` on
   the token-level rewards, before advantages (InstructGPT eq. 2; REINFORCE++).
2. The advantage fn (slot ``advantage``) gets exactly the inputs it declares.
3. Dynamic sampling (DAPO, arXiv:2503.14476 sec. 3.2): groups whose rewards are all equal
   carry no learning signal under a group baseline and are dropped before the update.
"""

from __future__ import annotations

from typing import Any

import torch

from trinity_like.components import call_component
from trinity_like.ops import apply_kl_penalty, groups_with_signal
from trinity_like.pipeline.batching import split_rows


def informative_rows(batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """Indices of the rows whose group's rewards are not all equal."""
    keep_B = groups_with_signal(batch["rewards"], batch["group_index"])
    return keep_B.nonzero(as_tuple=True)[0]


def drop_uninformative_groups(batch: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor] | None, int]:
    """The batch without groups of equal rewards (None if nothing is left), and how many rows went."""
    from trinity_like.ops import normalizers

    keep = informative_rows(batch)
    dropped = int(batch["rewards"].shape[0] - keep.numel())
    if keep.numel() == 0:
        return None, dropped
    if dropped == 0:
        return batch, 0
    out = split_rows(batch, keep)
    out.update(normalizers(out["response_mask"], out.get("is_expert")))
    return out, dropped


def compute_advantages(stage: Any, batch: dict[str, torch.Tensor]) -> dict[str, float]:
    """Fill ``batch["advantages"]`` and ``batch["returns"]`` in place; returns metrics."""
    comps = stage.components
    metrics: dict[str, float] = {}
    mask = batch["response_mask"]
    if "kl_penalty" in comps:
        comp = comps["kl_penalty"]
        sampler = batch.get("old_logprob", batch["rollout_logprob"])
        kl_BR = call_component(comp.fn, {"logprob": sampler, "ref_logprob": batch["ref_logprob"]})
        batch["token_level_rewards"], m = apply_kl_penalty(batch["token_level_rewards"], kl_BR, mask, coef=float(comp.coef or 0.0))
        metrics.update(m)
    if "advantage" not in comps:
        return metrics
    comp = comps["advantage"]
    inputs = dict(batch)
    inputs["action_mask"] = mask
    adv_BR, ret_BR = call_component(comp.fn, inputs, comp.params)
    adv_BR, ret_BR = adv_BR.detach().float(), ret_BR.detach().float()
    batch["advantages"] = adv_BR
    batch["returns"] = ret_BR
    valid = mask > 0
    if valid.any():
        metrics["advantages/mean"] = float(adv_BR[valid].mean())
        metrics["advantages/abs_mean"] = float(adv_BR[valid].abs().mean())
    return metrics
