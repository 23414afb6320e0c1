"""The training objective: registered components composed into one picklable loss callable.

    loss = policy_loss(...) + coef_kl * aggregate(KL(pi || ref)) + coef_ent * entropy_loss(...)

A rollout correction (slot ``rollout_correction``, registry ROLLOUT_CORRECTION) runs first: it
turns the trainer's ``old_logprob``, the sampler's ``rollout_logprob`` and the response mask
into per-token weights and a mask; the policy loss -- whichever it is -- then sees
``advantages * weights`` and ``action_mask * mask`` (an importance weight on each token's term
for a loss linear in the advantage; a masked token adds nothing and its gradient is 0). The KL
and entropy terms keep the unmasked tokens. Expert rows (MIX) were never sampled: weight 1, kept.

Every weighted term's coefficient is its slot's ``coef`` (:data:`trinity_like.components.WEIGHTED_SLOTS`):
the component computes the unweighted term and the objective multiplies. A slot that is
off (``name: none`` in the recipe) never reaches here: the resolver leaves it out.

An :class:`Objective` holds only component *names* and params objects
(:class:`trinity_like.components.ComponentSpec`), so it pickles to
Ray workers (the ``verl`` engine) and resolves the functions there, after the worker has
loaded the same plugins. Each component receives exactly the inputs it declares
(:func:`trinity_like.components.call_component`), taken from the batch and the model
outputs (``logprob``, ``entropy``, ``values``, ``scores``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from trinity_like.components import ComponentSpec, call_component, required_inputs
from trinity_like.ops import kl_loss_term

__all__ = ["ComponentSpec", "Objective", "gap_past_bound", "objective_from_stage", "sampler_gap"]


@dataclass(frozen=True)
class Objective:
    """Policy loss + optional KL loss term + optional entropy loss, as one loss callable.

    ``one_update``: the batch gets exactly one optimiser step, so the "old" (proximal)
    policy is the weights of that very step and its logprobs equal the current ones, whoever
    sampled the batch: they are taken as ``logprob.detach()`` instead of paying a second
    forward pass (exact: the ratio is 1 and its gradient is that of ``logprob``). Data from
    older weights (``synchronizer.offset``) is corrected against the sampler's own logprobs,
    ``rollout_logprob``, by a rollout correction (``rollout_correction``; ``ppo_tis`` is ppo with
    ``token_tis``), not by the old-policy ratio.
    """

    policy_loss: ComponentSpec
    kl_loss: ComponentSpec | None = None
    entropy_loss: ComponentSpec | None = None
    rollout_correction: ComponentSpec | None = None
    one_update: bool = False
    loss_metric: str = "policy_loss"  # the name its main term is reported under ("value_loss" for a critic)
    _cache: dict = field(default_factory=dict, compare=False, repr=False)

    def _fn(self, spec: ComponentSpec) -> Any:
        key = (spec.registry, spec.name)
        if key not in self._cache:
            self._cache[key] = spec.fn
        return self._cache[key]

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_cache"] = {}
        return state

    def __setstate__(self, state: dict) -> None:
        for k, v in state.items():
            object.__setattr__(self, k, v)

    @property
    def need_entropy(self) -> bool:
        comps = [self.policy_loss] + ([self.entropy_loss] if self.entropy_loss else [])
        return any("entropy" in required_inputs(self._fn(c)) for c in comps)

    def inputs_needed(self) -> set[str]:
        needed = set(required_inputs(self._fn(self.policy_loss)))
        if self.entropy_loss:
            needed |= required_inputs(self._fn(self.entropy_loss))
        if self.kl_loss:
            needed |= {"ref_logprob"}
        if self.rollout_correction:
            needed |= required_inputs(self._fn(self.rollout_correction))
        if self.one_update:
            needed.discard("old_logprob")
        return needed

    def _agg_mode(self) -> str:
        return getattr(self.policy_loss.params, "loss_agg_mode", "token-mean")

    def __call__(
        self, outputs: Mapping[str, torch.Tensor], batch: Mapping[str, torch.Tensor]
    ) -> tuple[torch.Tensor, dict[str, float]]:
        inputs: dict[str, Any] = dict(batch)
        inputs.update(outputs)
        if "response_mask" in inputs and "action_mask" not in inputs:
            inputs["action_mask"] = inputs["response_mask"]
        if self.one_update and "logprob" in outputs:
            inputs["old_logprob"] = outputs["logprob"].detach()
        policy_inputs, corr_metrics = self._corrected(inputs) if self.rollout_correction else (inputs, {})
        loss, metrics = call_component(self._fn(self.policy_loss), policy_inputs, self.policy_loss.params)
        metrics = {**dict(metrics), **corr_metrics}
        metrics[self.loss_metric] = float(loss.detach())
        if "rollout_logprob" in inputs and "logprob" in outputs:
            # The sampler's logprobs of its own tokens vs the trainer's: ~0 when the layouts,
            # weights and temperature agree; a drift here means off-policy data or a bug.
            diff = (outputs["logprob"].detach() - inputs["rollout_logprob"]).abs()
            mask = inputs["action_mask"]
            if "is_expert" in inputs:  # expert rows (MIX) were never sampled
                mask = mask * (~inputs["is_expert"].bool()).unsqueeze(-1)
            if mask.sum() > 0:
                metrics["rollout_logprob_diff"] = float((diff * mask).sum() / mask.sum())
        if self.kl_loss is not None:
            kl_BR = call_component(
                self._fn(self.kl_loss), {"logprob": inputs["logprob"], "ref_logprob": inputs["ref_logprob"]}
            )
            term, kl_metrics = kl_loss_term(
                kl_BR,
                inputs["action_mask"],
                coef=float(self.kl_loss.coef or 0.0),
                loss_agg_mode=self._agg_mode(),
                num_tokens=inputs.get("num_tokens"),
                num_seqs=inputs.get("num_seqs"),
            )
            loss = loss + term
            metrics.update(kl_metrics)
        if self.entropy_loss is not None:
            ent, ent_metrics = call_component(self._fn(self.entropy_loss), inputs, self.entropy_loss.params)
            loss = loss + float(self.entropy_loss.coef or 0.0) * ent
            metrics.update(ent_metrics)
        if not torch.isfinite(loss.detach()):
            # A NaN/inf loss must not reach the weights: hand back a zero that backpropagates
            # into nothing, and let the trainer skip the step (it counts and limits these).
            metrics["nonfinite_loss"] = 1.0
            return torch.zeros((), dtype=loss.dtype, device=loss.device, requires_grad=True), metrics
        return loss, metrics

    def _corrected(self, inputs: dict[str, Any]) -> tuple[dict[str, Any], dict[str, float]]:
        """The policy loss's inputs with the rollout correction applied: advantages weighted, tokens masked."""
        spec = self.rollout_correction
        mask_BR = inputs["action_mask"]
        sampled_BR = torch.ones_like(mask_BR, dtype=torch.bool)
        if "is_expert" in inputs:  # expert rows (MIX) have no sampler logprobs: left as they are
            sampled_BR = (~inputs["is_expert"].bool()).unsqueeze(-1).expand_as(mask_BR)
        weights_BR, keep_BR, metrics = call_component(
            self._fn(spec),
            {**inputs, "action_mask": mask_BR * sampled_BR.to(mask_BR.dtype)},
            spec.params,
        )
        weights_BR = torch.where(sampled_BR, weights_BR.detach(), torch.ones_like(weights_BR))
        keep_BR = torch.where(sampled_BR, keep_BR, mask_BR)
        out = dict(inputs)
        out["advantages"] = inputs["advantages"] * weights_BR.to(inputs["advantages"].dtype)
        out["action_mask"] = keep_BR.to(mask_BR.dtype)
        return out, dict(metrics)


def sampler_gap(
    logprob_BR: torch.Tensor, rollout_logprob_BR: torch.Tensor, mask_BR: torch.Tensor, is_expert_B: torch.Tensor | None
) -> dict[str, float]:
    """How far the trainer's logprobs of the sampled tokens are from the sampler's own, over a whole batch.

    ``logprob``: the trainer's, at the weights that sampled the batch (the first epoch's forward);
    ``rollout_logprob``: what the rollout engine reported for the same tokens. Both ``[B, R]``;
    ``mask``: the trained response tokens; expert rows (``is_expert [B]``, MIX) were never
    sampled and are left out. Returns, over the sampled tokens (nothing when there are none):

    - ``train/sampler_kl_k3``: mean of k3 = (r - 1) - log r, r = pi_train / pi_sampler -- an
      unbiased, non-negative estimate of KL(sampler || trainer) from the sampler's own tokens
      (Schulman, "Approximating KL divergence", 2020);
    - ``train/sampler_logprob_diff_max`` and ``train/sampler_logprob_diff_mean``: the largest
      and the mean |log pi_train - log pi_sampler|.

    ~0 when both run the same weights in the same precision; bf16 sampling against fp32 (or
    mixed) training, or stale weights, make it grow -- then turn on an off-policy correction
    (``docs/precision.md``).
    """
    mask = mask_BR.bool()
    if is_expert_B is not None:
        mask = mask & ~is_expert_B.bool().unsqueeze(-1)
    if not mask.any():
        return {}
    log_ratio = (logprob_BR.detach().double() - rollout_logprob_BR.double())[mask]
    k3 = torch.expm1(log_ratio) - log_ratio
    return {
        "train/sampler_kl_k3": float(k3.mean()),
        "train/sampler_logprob_diff_max": float(log_ratio.abs().max()),
        "train/sampler_logprob_diff_mean": float(log_ratio.abs().mean()),
    }


GAP_METRIC = "train/sampler_kl_k3"


def gap_past_bound(gap: Mapping[str, float], step: int, max_kl_k3: float | None) -> str | None:
    """One line naming step, metric, value and bound when ``gap``'s k3 is above ``max_kl_k3``; else None.

    The recipe's ``trainer.sampler_gap`` decides whether the line stops the run or is a warning."""
    value = gap.get(GAP_METRIC)
    if max_kl_k3 is None or value is None or not value > max_kl_k3:
        return None
    return (
        f"step {step}: {GAP_METRIC} = {value:.3g} is above trainer.sampler_gap.max_kl_k3 = {max_kl_k3:.3g}: "
        "the sampler's logprobs are far from the trainer's (precision, stale weights or a failed sync; "
        "docs/precision.md)"
    )


class StageSlots(Protocol):
    """What the objective reads of a resolved recipe stage (:class:`trinity_like.config.ResolvedStage`,
    which the trainer does not import): its slots."""

    @property
    def components(self) -> Mapping[str, ComponentSpec]:
        """Slot -> component; a slot that is off is absent."""


def objective_from_stage(stage: StageSlots, *, one_update: bool) -> Objective:
    """Build the objective of a resolved recipe stage (:class:`trinity_like.config.ResolvedStage`)."""
    comps = stage.components
    return Objective(
        policy_loss=comps["policy_loss"],
        kl_loss=comps.get("kl_loss"),
        entropy_loss=comps.get("entropy_loss"),
        rollout_correction=comps.get("rollout_correction"),
        one_update=one_update,
    )
