"""The ``arithmetic`` env: a single-turn answer task -- one prompt, one answer, one reward.

It is the explorer's math workflow written as an env, so the old path (``WORKFLOW``
``math``) and the new one give the same episodes: the same prompt (the task's chat
messages under the tokenizer's chat template), the same samples for the same seed (see
:func:`~trinity_like.envs.rollout.episode_seed`) and the same reward function on the same
decoded text. Any :class:`~trinity_like.experience.Task` works; the arithmetic task source
is its default use. Example::

    factory = build_env_factory("arithmetic", {"max_tokens": 16}, tokenizer=tok)
    tasks = arithmetic_tasks(ArithmeticParams(), "train", 64)
    result = rollout_groups(TaskEnvDataset(tasks, factory, batch_size=8, group_size=4).get_batch(0),
                            engine=engine, seed=0)
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from trinity_like.envs.dataset import TaskGroupBuilder
from trinity_like.envs.types import Env, EnvFactory, EnvGroupBuilder, StepResult, StopCondition
from trinity_like.experience import Task
from trinity_like.explorer.rewards import RewardCall, build_reward_fn
from trinity_like.models.chat import render_prompt
from trinity_like.registry import ENV


@dataclass(frozen=True)
class AnswerEnvParams:
    """How the answer is sampled and scored."""

    reward_fn: str = "exact_match"  # REWARD_FN name
    reward_params: Mapping[str, Any] = field(default_factory=dict)  # params of that reward fn
    max_tokens: int = 64  # most tokens of the answer


class AnswerEnv(Env):
    """Asks the task's prompt once and scores the answer with a reward function."""

    def __init__(self, *, task: Task, prompt: list[int], reward: RewardCall, tokenizer: Any, max_tokens: int) -> None:
        self.task = task
        self.prompt = prompt
        self.reward = reward
        self.tokenizer = tokenizer
        self.stop = StopCondition(max_tokens=max_tokens)

    def initial_observation(self) -> tuple[list[int], StopCondition]:
        return list(self.prompt), self.stop

    def step(self, action_tokens: list[int]) -> StepResult:
        text = self.tokenizer.decode(action_tokens, skip_special_tokens=True)
        inputs = {"response": text, "answer": self.task.answer, "task": self.task, "messages": self.task.messages()}
        reward = self.reward(inputs)
        if not math.isfinite(reward):  # bad luck of user code, like a raise: the rollout retries, then drops
            raise ValueError(f"the reward function gave {reward!r}")
        return StepResult(reward, episode_done=True, next_stop_condition=self.stop)


@ENV.register_module("arithmetic")
class ArithmeticEnvs(EnvFactory):
    """Single-turn answer tasks (the arithmetic task): chat prompt -> answer -> reward fn, like WORKFLOW math."""

    def __init__(self, *, tokenizer: Any, params: AnswerEnvParams) -> None:
        self.tokenizer = tokenizer
        self.params = params
        self.reward = build_reward_fn(params.reward_fn, params.reward_params)
        StopCondition(max_tokens=params.max_tokens)  # a bad max_tokens fails here, not in every episode

    def group_builder(self, task: Task, group_size: int) -> EnvGroupBuilder:
        prompt = render_prompt(self.tokenizer, task.messages())  # once per group: the envs share it

        def make_env() -> Env:
            return AnswerEnv(
                task=task,
                prompt=prompt,
                reward=self.reward,
                tokenizer=self.tokenizer,
                max_tokens=self.params.max_tokens,
            )

        return TaskGroupBuilder(task, group_size, make_env)
