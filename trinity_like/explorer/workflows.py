"""Workflows (the WORKFLOW registry): how tasks become scored experiences.

A workflow is a class built with ``params`` (a frozen dataclass) whose ``run`` takes a
batch of tasks, the rollout engine and the sampling params, and returns the experiences,
the tasks it had to skip (with the reason) and metrics. Example::

    workflow = WORKFLOW.get("math")(params=MathWorkflowParams(reward_fn="exact_match"))
    result = workflow.run(tasks, engine=engine, sampling=SamplingParams(n=8))
    result.experiences  # 8 per task that was scored, sharing one group_id per task
    result.skipped      # [SkippedTask(task_id, reason), ...]

All tasks of a batch go to the engine in one call, so groups share prefills and the
engine's continuous batching sees the whole batch. A task whose reward cannot be computed
(the reward function raised or exceeded its time limit on every retry) is skipped as a
whole group -- a group with a missing member would bias its advantage baseline -- and
counted in ``metrics["workflow/skipped_tasks"]``.

**The gold reward.** When the trained reward is not the task's verifier (a learned reward
model, a shaped reward), every response is also scored by the verifier
(``explorer.gold_reward_fn``, by default ``eval_reward_fn`` when it differs from
``reward_fn``: :func:`trinity_like.config.engine_params.gold_reward`). It is kept in ``info["gold_reward"]`` and logged as
``reward/gold_mean`` beside ``reward/mean``, with their Pearson correlation over the batch
(``reward/gold_corr``); it never trains. A gold call that fails leaves that response's gold
reward out (``workflow/gold_errors``) and skips nothing.

**Batch transforms.** ``reward_transform`` (a REWARD_TRANSFORM name, set through
``explorer.workflow_args``) rewrites the batch's rewards after they are all scored (per-batch
clipping or normalisation of reward-model scores: :mod:`.reward_mitigations`); the raw
reward stays in ``info["raw_reward"]`` and ``reward/raw_mean``.
"""

from __future__ import annotations

import statistics
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from trinity_like.components import build_params
from trinity_like.errors import ConfigError, TrinityError
from trinity_like.experience import Experience, Task
from trinity_like.explorer.engine_contract import generate
from trinity_like.explorer.rewards import (
    RewardCall,
    build_reward_fn,
    score_with_retries,
)
from trinity_like.models.chat import render_prompt
from trinity_like.monitor.reward_stats import pearson
from trinity_like.registry import REWARD_TRANSFORM, WORKFLOW, UnknownNameError

if TYPE_CHECKING:  # the engine imports transformers: only when a workflow runs
    from trinity_like.explorer.engine_contract import RolloutEngine, SamplingParams


@dataclass(frozen=True)
class SkippedTask:
    """A task that produced no experiences, and why."""

    task_id: str
    reason: str  # e.g. "reward_fn: timeout" or "reward_fn: ValueError: ..."


@dataclass
class WorkflowResult:
    """What one workflow run produced."""

    experiences: list[Experience]
    skipped: list[SkippedTask]
    metrics: dict[str, float]


@dataclass(frozen=True)
class MathWorkflowParams:
    """Single-turn answer tasks: chat prompt -> response -> reward."""

    reward_fn: str = "exact_match"  # REWARD_FN name
    reward_params: Mapping[str, Any] = field(default_factory=dict)  # params of that reward fn
    reward_timeout_s: float = 10.0  # time limit of one reward call
    reward_retries: int = 1  # further attempts after a failed or timed-out call
    gold_reward_fn: str = ""  # REWARD_FN scored beside the reward and logged, never trained on; "": none
    gold_reward_params: Mapping[str, Any] = field(default_factory=dict)  # params of that gold reward fn
    reward_transform: str = ""  # REWARD_TRANSFORM applied to the batch's rewards once all are scored; "": none
    reward_transform_args: Mapping[str, Any] = field(default_factory=dict)  # params of that transform

    def __post_init__(self) -> None:
        if self.reward_transform:  # checked here, so a recipe's mistake fails at validation
            BatchTransform(self.reward_transform, self.reward_transform_args)


class BatchTransform:
    """A REWARD_TRANSFORM entry with its params, called on a batch's rewards."""

    def __init__(self, name: str, values: Mapping[str, Any]) -> None:
        self.name = name
        try:
            self.fn = REWARD_TRANSFORM.get(name)
        except UnknownNameError as exc:
            raise ConfigError(f"explorer.workflow_args.reward_transform: {exc}") from None
        self.params = build_params(self.fn, values, where="explorer.workflow_args.reward_transform_args")

    def __call__(self, rewards: list[float]) -> list[float]:
        out = (
            self.fn(rewards=list(rewards), params=self.params)
            if self.params is not None
            else self.fn(rewards=list(rewards))
        )
        if len(out) != len(rewards):
            raise TrinityError(f"reward transform {self.name!r} returned {len(out)} rewards for {len(rewards)}")
        return [float(x) for x in out]


@WORKFLOW.register_module("math")
class MathWorkflow:
    """Single-turn math/answer tasks: chat-template prompt, sampled responses, a pluggable reward."""

    def __init__(self, *, params: MathWorkflowParams) -> None:
        self.params = params
        self.reward = build_reward_fn(params.reward_fn, params.reward_params)
        self.gold: RewardCall | None = (
            build_reward_fn(params.gold_reward_fn, params.gold_reward_params) if params.gold_reward_fn else None
        )
        self.transform = (
            BatchTransform(params.reward_transform, params.reward_transform_args) if params.reward_transform else None
        )

    def run(self, tasks: Sequence[Task], *, engine: RolloutEngine, sampling: SamplingParams) -> WorkflowResult:
        tokenizer = engine.tokenizer
        if tokenizer is None:
            raise TrinityError("MathWorkflow needs an engine with a tokenizer")
        prompts = [render_prompt(tokenizer, task.messages()) for task in tasks]
        groups = generate(engine, prompts, sampling)
        experiences: list[Experience] = []
        skipped: list[SkippedTask] = []
        failures = {"timeout": 0, "error": 0, "gold": 0}
        retried = 0
        for task, prompt, group in zip(tasks, prompts, groups):
            group_id = uuid.uuid4().hex
            rows: list[Experience] = []
            reason = ""
            for sample in group:
                text = tokenizer.decode(sample.token_ids, skip_special_tokens=True)
                inputs = {"response": text, "answer": task.answer, "task": task, "messages": task.messages()}
                outcome = score_with_retries(
                    self.reward, inputs, retries=self.params.reward_retries, timeout_s=self.params.reward_timeout_s
                )
                retried += outcome.attempts - 1
                if outcome.reward is None:
                    failures["timeout" if outcome.error == "timeout" else "error"] += 1
                    reason = f"reward_fn {self.params.reward_fn}: {outcome.error}"
                    break
                info: dict[str, Any] = {"response_text": text, "answer": task.answer}
                if self.gold is not None:
                    gold = score_with_retries(
                        self.gold, inputs, retries=self.params.reward_retries, timeout_s=self.params.reward_timeout_s
                    )
                    failures["gold"] += gold.reward is None
                    info["gold_reward"] = gold.reward
                rows.append(
                    Experience(
                        tokens=list(prompt) + list(sample.token_ids),
                        prompt_length=len(prompt),
                        logprobs=list(sample.logprobs),
                        reward=outcome.reward,
                        group_id=group_id,
                        task_id=task.task_id,
                        model_version=sample.model_version,
                        weights_digest=sample.weights_digest,
                        finish_reason=sample.finish_reason,
                        info=info,
                    )
                )
            if reason:
                skipped.append(SkippedTask(task.task_id, reason))
            else:
                experiences.extend(rows)
        raw = [float(e.reward) for e in experiences]
        if self.transform is not None and experiences:
            for e, r, new in zip(experiences, raw, self.transform(raw)):
                e.info["raw_reward"] = r
                e.reward = new
        metrics = workflow_metrics(experiences, len(tasks), skipped, failures, retried)
        if self.transform is not None and raw:
            metrics["reward/raw_mean"] = statistics.fmean(raw)
        if self.gold is not None:
            metrics.update(gold_metrics(experiences, failures["gold"]))
        return WorkflowResult(experiences, skipped, metrics)


def gold_metrics(experiences: list[Experience], errors: int) -> dict[str, float]:
    """``reward/gold_mean`` and ``reward/gold_corr`` (Pearson's r of the trained reward and the
    gold one over the batch; absent when either is constant) of the rows with a gold reward."""
    pairs = [
        (float(e.reward), float(e.info["gold_reward"])) for e in experiences if e.info.get("gold_reward") is not None
    ]
    out = {"workflow/gold_errors": float(errors)}
    if pairs:
        learned, gold = zip(*pairs)
        out["reward/gold_mean"] = statistics.fmean(gold)
        corr = pearson(learned, gold)
        if corr is not None:
            out["reward/gold_corr"] = corr
    return out


def workflow_metrics(
    experiences: list[Experience], num_tasks: int, skipped: list[SkippedTask], failures: dict[str, int], retried: int
) -> dict[str, float]:
    """A workflow run's ``workflow/*`` counts and its rewards, lengths and finish reasons;
    ``failures`` counts reward calls that timed out / raised, ``retried`` their retries."""
    rewards = [e.reward for e in experiences if e.reward is not None]
    lengths = [e.response_length for e in experiences]
    metrics = {
        "workflow/tasks": float(num_tasks),
        "workflow/skipped_tasks": float(len(skipped)),
        "workflow/reward_timeouts": float(failures["timeout"]),
        "workflow/reward_errors": float(failures["error"]),
        "workflow/reward_retries": float(retried),
        "workflow/experiences": float(len(experiences)),
    }
    if rewards:
        metrics["reward/mean"] = statistics.fmean(rewards)
        metrics["reward/std"] = statistics.pstdev(rewards)
        metrics["response_length/mean"] = statistics.fmean(lengths)
        metrics["response_length/max"] = float(max(lengths))
        metrics["finish/length_frac"] = sum(e.finish_reason == "length" for e in experiences) / len(experiences)
    return metrics
