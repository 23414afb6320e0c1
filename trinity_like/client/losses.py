"""Tinker's named losses as our registered policy losses, reduced by SUM as the SDK reduces them.

The client's ``forward_backward(data, loss_fn, loss_fn_config)`` runs a POLICY_LOSS_FN
entry -- the registry a recipe and a plugin use -- so a plugin's loss is callable by name
from the client too. Tinker's names map onto entries with token-sum aggregation:

===================  ===================  ===========================================  ==================================
Tinker ``loss_fn``   registered loss      ``loss_fn_inputs`` it reads                  ``loss_fn_config`` (default)
===================  ===================  ===========================================  ==================================
cross_entropy        sft                  target_tokens, weights                       --
importance_sampling  importance_sampling  target_tokens, logprobs, advantages          --
ppo                  ppo                  target_tokens, logprobs, advantages          clip_low_threshold (0.8), clip_high_threshold (1.2)
cispo                cispo                target_tokens, logprobs, advantages          clip_low_threshold (0.8), clip_high_threshold (1.2)
dro                  dro                  target_tokens, logprobs, advantages          beta (0.05)
tis (ours)           ppo_tis              target_tokens, logprobs, advantages          tis_cap (2.0)
===================  ===================  ===========================================  ==================================

Any other name is looked up in POLICY_LOSS_FN as it is, with ``loss_fn_config`` as its
params. Arrays are per position of the model input: position i predicts token i + 1; the
``logprobs`` input holds the sampler's logprobs of the target tokens and ``advantages``
are the caller's (no baseline or normalisation inside a loss).

``tis`` is truncated importance sampling (``algorithms/losses/tis.py``, verl's rollout
correction): a datum's ``logprobs`` are the sampler's (the loss's ``rollout_logprob``) and
the proximal policy is the learner's weights of this very call (``old_logprob`` =
``logprob``, detached), so the gradient is ``-A min(pi / mu, tis_cap) grad log pi``: the
``importance_sampling`` gradient with its ratio truncated at ``tis_cap``. Exact when each
datum gets one update, as in the cookbook loop (``cookbook.rl.train``).

Example (``lp``: the learner's logprobs of the target tokens, ``[B, T]``)::

    spec = loss_spec("ppo", {"clip_high_threshold": 1.28})
    loss, metrics = call_component(spec.fn, loss_inputs("ppo", lp, arrays, mask), spec.params)
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
from tinker.lib.chunked_fwdbwd_helpers import REDUCE_MAP

from trinity_like.components import ComponentSpec, build_params
from trinity_like.errors import ConfigError
from trinity_like.registry import POLICY_LOSS_FN

RL_INPUTS = ("target_tokens", "logprobs", "advantages")
THRESHOLDS = {"clip_low_threshold": 0.8, "clip_high_threshold": 1.2}  # the SDK's ppo defaults


@dataclass(frozen=True)
class TinkerLoss:
    """How one of Tinker's loss names runs as a registered loss."""

    registered: str  # POLICY_LOSS_FN name
    inputs: tuple[str, ...]  # the Datum's loss_fn_inputs keys it reads
    config: Mapping[str, float]  # loss_fn_config keys it takes, with their defaults
    proximal_is_current: bool = False  # old_logprob = the learner's own (detached); the sampler's = rollout_logprob

    def params(self, config: Mapping[str, Any]) -> dict[str, Any]:
        """Our params for a Tinker ``loss_fn_config``: ratio thresholds become clip widths."""
        values = {**self.config, **config}
        out: dict[str, Any] = {"loss_agg_mode": "token-sum"}
        if "clip_low_threshold" in values:
            out["clip_ratio_low"] = 1.0 - float(values.pop("clip_low_threshold"))
            out["clip_ratio_high"] = float(values.pop("clip_high_threshold")) - 1.0
        return {**out, **values}


TINKER_LOSSES: dict[str, TinkerLoss] = {
    "cross_entropy": TinkerLoss("sft", ("target_tokens", "weights"), {}),
    "importance_sampling": TinkerLoss("importance_sampling", RL_INPUTS, {}),
    "ppo": TinkerLoss("ppo", RL_INPUTS, THRESHOLDS),
    "cispo": TinkerLoss("cispo", RL_INPUTS, THRESHOLDS),
    "dro": TinkerLoss("dro", RL_INPUTS, {"beta": 0.05}),
}
# The names forward_backward knows: Tinker's, and ours in the same form.
CLIENT_LOSSES: dict[str, TinkerLoss] = {
    **TINKER_LOSSES,
    "tis": TinkerLoss("ppo_tis", RL_INPUTS, {"tis_cap": 2.0}, proximal_is_current=True),
}


def loss_spec(name: str, config: Mapping[str, Any] | None = None) -> ComponentSpec:
    """The registered loss (and its params) that ``forward_backward(..., loss_fn=name)`` runs."""
    config = dict(config or {})
    known = CLIENT_LOSSES.get(name)
    if known is not None:
        unknown = set(config) - set(known.config)
        if unknown:
            raise ConfigError(
                f"loss_fn_config: {name!r} takes {sorted(known.config) or 'no options'}, not {sorted(unknown)}"
            )
        registered, values = known.registered, known.params(config)
    elif name in POLICY_LOSS_FN:
        registered, values = name, config
    else:
        raise ConfigError(
            f"unknown loss_fn {name!r} (Tinker's: {', '.join(TINKER_LOSSES)}; ours: "
            f"{', '.join(sorted(set(CLIENT_LOSSES) - set(TINKER_LOSSES)))}; "
            f"registered: {', '.join(POLICY_LOSS_FN.names())})"
        )
    params = build_params(POLICY_LOSS_FN.get(registered), values, where=f"loss_fn_config of {name!r}")
    return ComponentSpec("POLICY_LOSS_FN", registered, params)


def required_arrays(name: str) -> tuple[str, ...]:
    """The ``loss_fn_inputs`` keys a Datum must carry for ``name`` (a plugin loss: target_tokens only)."""
    known = CLIENT_LOSSES.get(name)
    return known.inputs if known is not None else ("target_tokens",)


def loss_inputs(
    name: str, logprob_BT: torch.Tensor, arrays: Mapping[str, torch.Tensor], mask_BT: torch.Tensor
) -> dict[str, torch.Tensor]:
    """The keyword inputs of the registered loss from a padded batch of Datums.

    ``mask_BT`` is 1 on each datum's positions (0 on padding); cross-entropy weighs them by
    ``weights`` instead. ``logprobs`` (the sampler's) is the losses' ``old_logprob``, or their
    ``rollout_logprob`` for a loss whose proximal policy is the learner itself (``tis``).
    """
    out = {"logprob": logprob_BT, "action_mask": arrays["weights"] * mask_BT if name == "cross_entropy" else mask_BT}
    known = CLIENT_LOSSES.get(name)
    if "logprobs" in arrays and known is not None and known.proximal_is_current:
        out["old_logprob"], out["rollout_logprob"] = logprob_BT.detach(), arrays["logprobs"]
    elif "logprobs" in arrays:
        out["old_logprob"] = arrays["logprobs"]
    if "advantages" in arrays:
        out["advantages"] = arrays["advantages"]
    return out


# The reductions the SDK combines a metric's chunks by: a server-side key is ``name:<one of these>``.
REDUCTIONS = tuple(REDUCE_MAP)


def reported_metrics(loss_fn: str, metrics: Mapping[str, Any]) -> dict[str, float]:
    """A named loss's own metrics as the SDK's keys: ``<key>:mean`` (the engine averages them
    over micro-batches). A key holding a colon already would come back as ``a:b:mean``, which
    the SDK cannot split into ``name:reduction`` when it combines chunks: one line naming it.

    >>> reported_metrics("ppo", {"clip_frac": 0.25})
    {'clip_frac:mean': 0.25}
    """
    out = {}
    for key, value in metrics.items():
        if ":" in key:
            raise ConfigError(
                f"loss {loss_fn!r} reports metric {key!r}: a loss's metric keys hold no ':' (the client "
                f"reports each as '<key>:mean', the SDK's name:reduction with reductions {', '.join(REDUCTIONS)})"
            )
        out[f"{key}:mean"] = float(value)
    return out


def custom_loss_result(result: Any) -> tuple[torch.Tensor, dict[str, float]]:
    """What a ``forward_backward_custom`` loss function returned, as ``(loss, metrics)``.

    ``loss``: a tensor of one element (any shape), finite, computed from the logprobs (it
    has a gradient); ``metrics``: a mapping of ``str`` to numbers, returned as given (the SDK
    merges them into the response without reducing them, so a key need not name a
    reduction). Anything else is one line that says what was returned instead::

        custom_loss_result(torch.tensor(1.0))   # TypeError: ... got a bare tensor ...
    """
    head = "forward_backward_custom: the loss function must return (loss, metrics)"
    if isinstance(result, torch.Tensor):
        raise TypeError(f"{head}, got a bare tensor of shape {list(result.shape)}; return (loss, {{}}) for no metrics")
    if not isinstance(result, tuple | list) or len(result) != 2:
        size = f" of length {len(result)}" if isinstance(result, tuple | list) else ""
        raise TypeError(f"{head}, got {type(result).__name__}{size}")
    loss, metrics = result
    if not isinstance(loss, torch.Tensor):
        raise TypeError(f"{head}: loss must be a torch tensor computed from the logprobs, got {type(loss).__name__}")
    if loss.numel() != 1:
        raise ValueError(f"{head}: loss must hold one value, got shape {list(loss.shape)} (sum or mean it)")
    if not loss.requires_grad:
        raise ValueError(f"{head}: loss does not depend on the logprobs it was given (it has no gradient)")
    if not math.isfinite(float(loss.detach())):
        raise ValueError(f"{head}: loss is {float(loss.detach())}, not finite; no gradient was applied")
    if not isinstance(metrics, Mapping):
        raise TypeError(f"{head}: metrics must be a dict of str -> float, got {type(metrics).__name__}")
    out = {}
    for key, value in metrics.items():
        if not isinstance(key, str):
            raise TypeError(f"{head}: metrics keys must be str, got {key!r}")
        try:
            out[key] = float(value)
        except (TypeError, ValueError, RuntimeError):
            raise TypeError(f"{head}: metrics[{key!r}] must be a number, got {type(value).__name__}") from None
    return loss, out
