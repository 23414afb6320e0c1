"""Mitigations of reward over-optimisation, switched on from a recipe.

A policy trained on a learned reward finds what the reward model scores high but the task
does not want (Gao et al. 2022, "Scaling Laws for Reward Model Overoptimization"). Each
mitigation here is a registered component:

- ``rm_ensemble`` (REWARD_FN): M reward models (folders, or run directories: their latest
  checkpoint) score a response; the reward is ``mean - k * std`` over them, so responses the
  models disagree on earn less (Coste et al. 2023, "Reward Model Ensembles Help Mitigate
  Overoptimization": worst-case and uncertainty-weighted objectives).
- ``composite`` (REWARD_FN): a weighted sum of named reward fns, e.g. a reward model plus a
  rule-based ``format`` bonus: ``{terms: [{name: reward_model, args: {path: runs/rm}},
  {name: format, weight: 0.5}]}``.
- ``batch_clip`` and ``batch_normalize`` (REWARD_TRANSFORM): per-batch clipping (to
  ``mean +- std_clip * std`` of the batch, and/or fixed bounds) or z-scoring of the scores,
  applied by the workflow once a batch is scored (``explorer.workflow_args:
  {reward_transform: batch_clip, reward_transform_args: {std_clip: 2.0}}``). GRPO's
  group-normalised advantage is unchanged by an affine map of the rewards, so
  ``batch_normalize`` matters for reward scale only (KL shaping, RLOO, Dr. GRPO);
  clipping is not affine and caps the outliers a policy would chase.

Example::

    fn = build_reward_fn("composite", {"terms": [{"name": "exact_match"}, {"name": "format", "weight": 0.5}]})
    fn({"response": "42", "answer": "42"})   # 1.0 + 0.5 * 1.0 = 1.5
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from trinity_like.errors import ConfigError, TrinityError
from trinity_like.experience import Task
from trinity_like.registry import REWARD_FN, REWARD_TRANSFORM


# -- reward model ensemble ----------------------------------------------------------------------
@dataclass(frozen=True)
class EnsembleParams:
    paths: tuple[str, ...] = ()  # reward-model folders or rm run directories (each: its latest checkpoint), two or more
    k: float = 1.0  # reward = mean - k * std over the models (population std); 0: the plain mean
    max_length: int = 2048  # prompt + response tokens kept (the end is kept)

    def __post_init__(self) -> None:
        if len(self.paths) < 2:
            raise ConfigError(f"rm_ensemble: paths needs two or more reward models, got {len(self.paths)}")


@REWARD_FN.register_module("rm_ensemble")
class RewardModelEnsemble:
    """mean - k * std of several reward models' scores on the prompt and response."""

    def __init__(self, *, params: EnsembleParams) -> None:
        from trinity_like.models.reward_model import load_reward_model

        self.models = [load_reward_model(p) for p in params.paths]
        self.params = params

    def scores(self, messages: list[dict[str, str]], response: str) -> list[float]:
        """Each model's score, in the order of ``paths``."""
        from trinity_like.models.reward_model import score_conversations

        conversation = [*messages, {"role": "assistant", "content": response}]
        return [float(score_conversations(m, tok, [conversation], self.params.max_length)[0]) for m, tok in self.models]

    def __call__(self, *, messages: list[dict[str, str]], response: str) -> float:
        s = self.scores(messages, response)
        return statistics.fmean(s) - self.params.k * statistics.pstdev(s)


# -- composite -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class CompositeTerm:
    name: str  # REWARD_FN name of this term
    weight: float = 1.0  # its weight in the sum
    args: dict[str, Any] = field(default_factory=dict)  # its params


@dataclass(frozen=True)
class CompositeParams:
    terms: tuple[CompositeTerm, ...] = ()  # the reward is sum(weight * term) over these, at least one

    def __post_init__(self) -> None:
        """Each term's name and args are checked here, so a recipe's mistakes fail at validation."""
        from trinity_like.components import build_params

        if not self.terms:
            raise ConfigError("composite: terms is empty (give at least one {name, weight, args})")
        for i, term in enumerate(self.terms):
            if term.name == "composite":
                raise ConfigError(f"composite.terms.{i}: a composite inside a composite; list its terms here instead")
            try:
                build_params(REWARD_FN.get(term.name), term.args, where=f"composite.terms.{i}.args")
            except TrinityError as exc:  # an unknown name, a bad arg: say which term
                raise ConfigError(
                    f"composite.terms.{i}: {exc}" if not str(exc).startswith("composite.") else str(exc)
                ) from None


@REWARD_FN.register_module("composite")
class CompositeReward:
    """A weighted sum of named reward fns (e.g. a reward model plus a format bonus)."""

    def __init__(self, *, params: CompositeParams) -> None:
        from trinity_like.explorer.rewards import build_reward_fn

        self.terms = [(term.weight, build_reward_fn(term.name, term.args)) for term in params.terms]

    def __call__(
        self,
        *,
        response: str,
        answer: str | None = None,
        task: Task | None = None,
        messages: list[dict[str, str]] | None = None,
    ) -> float:
        given = {"response": response, "answer": answer, "task": task, "messages": messages}
        inputs: Mapping[str, Any] = {k: v for k, v in given.items() if v is not None}
        return sum(weight * fn(inputs) for weight, fn in self.terms)


# -- per-batch transforms ------------------------------------------------------------------------------
@dataclass(frozen=True)
class ClipParams:
    std_clip: float | None = 3.0  # clip to mean +- std_clip * std of the batch; None: no such bound
    low: float | None = None  # fixed lower bound; None: none
    high: float | None = None  # fixed upper bound; None: none


@REWARD_TRANSFORM.register_module("batch_clip")
def batch_clip(*, rewards: list[float], params: ClipParams) -> list[float]:
    """Each reward clipped to mean +- std_clip * std of the batch (population std), then to [low, high]."""
    lo, hi = -math.inf, math.inf
    if params.std_clip is not None and len(rewards) > 1:
        mean, std = statistics.fmean(rewards), statistics.pstdev(rewards)
        lo, hi = mean - params.std_clip * std, mean + params.std_clip * std
    if params.low is not None:
        lo = max(lo, params.low)
    if params.high is not None:
        hi = min(hi, params.high)
    return [min(max(r, lo), hi) for r in rewards]


@dataclass(frozen=True)
class NormalizeParams:
    eps: float = 1e-6  # added to the batch std before dividing
    clip: float | None = None  # then clip the z-scores to [-clip, clip]; None: no clip


@REWARD_TRANSFORM.register_module("batch_normalize")
def batch_normalize(*, rewards: list[float], params: NormalizeParams) -> list[float]:
    """(r - batch mean) / (batch std + eps), optionally clipped to [-clip, clip]."""
    mean, std = statistics.fmean(rewards), statistics.pstdev(rewards)
    z = [(r - mean) / (std + params.eps) for r in rewards]
    return z if params.clip is None else [min(max(x, -params.clip), params.clip) for x in z]
