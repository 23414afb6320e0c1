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
"""

from __future__ import annotations

import statistics
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from trinity_like.errors import TrinityError
from trinity_like.experience import Experience, Task
from trinity_like.explorer.rewards import build_reward_fn, score_with_retries
from trinity_like.models.resolve import render_prompt
from trinity_like.registry import WORKFLOW

if TYPE_CHECKING:  # the engine imports transformers: only when a workflow runs
    from trinity_like.explorer.engine import RolloutEngine, SamplingParams


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


@WORKFLOW.register_module("math")
class MathWorkflow:
    """Single-turn math/answer tasks: chat-template prompt, sampled responses, a pluggable reward."""

    def __init__(self, *, params: MathWorkflowParams) -> None:
        self.params = params
        self.reward = build_reward_fn(params.reward_fn, params.reward_params)

    def run(self, tasks: Sequence[Task], *, engine: RolloutEngine, sampling: SamplingParams) -> WorkflowResult:
        tokenizer = engine.tokenizer
        if tokenizer is None:
            raise TrinityError("MathWorkflow needs an engine with a tokenizer")
        prompts = [render_prompt(tokenizer, task.messages()) for task in tasks]
        groups = engine.generate(prompts, sampling)
        experiences: list[Experience] = []
        skipped: list[SkippedTask] = []
        failures = {"timeout": 0, "error": 0}
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
                rows.append(
                    Experience(
                        tokens=list(prompt) + list(sample.token_ids),
                        prompt_length=len(prompt),
                        logprobs=list(sample.logprobs),
                        reward=outcome.reward,
                        group_id=group_id,
                        task_id=task.task_id,
                        model_version=sample.model_version,
                        finish_reason=sample.finish_reason,
                        info={"response_text": text, "answer": task.answer},
                    )
                )
            if reason:
                skipped.append(SkippedTask(task.task_id, reason))
            else:
                experiences.extend(rows)
        metrics = workflow_metrics(experiences, len(tasks), skipped, failures, retried)
        return WorkflowResult(experiences, skipped, metrics)


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
