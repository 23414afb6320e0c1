"""Envs from tasks: the ``ENV`` registry's entries, and datasets of their groups.

An ``ENV`` entry is an :class:`~trinity_like.envs.types.EnvFactory` class, built once with
``tokenizer`` and ``params`` (its own frozen dataclass, built from a recipe's or a caller's
values -- unknown keys are errors), that turns one :class:`~trinity_like.experience.Task`
into a group builder. Tasks are the unit both front doors already have: a recipe's
explorer reads them from the buffer, a client loop from any task source. Example (the
``calculator`` env and its tasks are the ``cookbook`` pack's, ``cookbook.envs.calculator``)::

    factory = build_env_factory("calculator", {"max_turns": 3}, tokenizer=tok)
    dataset = TaskEnvDataset(calculator_tasks("train", 256), factory, batch_size=8, group_size=4)
    builders = dataset.get_batch(0)      # 8 groups of 4 calculator episodes
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from trinity_like.components import build_params
from trinity_like.envs.types import Env, EnvFactory, EnvGroupBuilder, RLDataset
from trinity_like.errors import TrinityError
from trinity_like.experience import Task
from trinity_like.registry import ENV


class TaskGroupBuilder(EnvGroupBuilder):
    """``group_size`` independent envs of one task, each made by ``make_env()``: the usual
    GRPO group, whose baseline is the mean return of the same task's attempts."""

    def __init__(self, task: Task, group_size: int, make_env: Callable[[], Env], tags: Sequence[str] = ()) -> None:
        if group_size < 1:
            raise TrinityError(f"TaskGroupBuilder: group_size must be >= 1, got {group_size}")
        self.task = task
        self.group_size = group_size
        self.make_env = make_env
        self.tags = list(tags)

    def make_envs(self) -> list[Env]:
        return [self.make_env() for _ in range(self.group_size)]

    def logging_tags(self) -> list[str]:
        return list(self.tags)


class TaskEnvDataset(RLDataset):
    """Batches of ``batch_size`` tasks, each task a group of ``group_size`` envs from ``factory``.

    A last batch with fewer than ``batch_size`` tasks is left out, so every batch has the
    same number of groups.
    """

    def __init__(self, tasks: Sequence[Task], factory: EnvFactory, *, batch_size: int, group_size: int) -> None:
        if batch_size < 1 or group_size < 1:
            raise TrinityError(
                f"TaskEnvDataset: batch_size and group_size must be >= 1, got {batch_size} and {group_size}"
            )
        if len(tasks) < batch_size:
            raise TrinityError(f"TaskEnvDataset: {len(tasks)} tasks cannot fill one batch of {batch_size}")
        self.tasks = list(tasks)
        self.factory = factory
        self.batch_size = batch_size
        self.group_size = group_size

    def __len__(self) -> int:
        return len(self.tasks) // self.batch_size

    def get_batch(self, index: int) -> list[EnvGroupBuilder]:
        if not 0 <= index < len(self):
            raise TrinityError(f"TaskEnvDataset: batch {index} out of range 0..{len(self) - 1}")
        tasks = self.tasks[index * self.batch_size : (index + 1) * self.batch_size]
        return [_group_builder(self.factory, task, self.group_size) for task in tasks]


def _group_builder(factory: EnvFactory, task: Task, group_size: int) -> EnvGroupBuilder:
    builder = factory.group_builder(task, group_size)
    if not isinstance(builder, EnvGroupBuilder):
        raise TrinityError(
            f"{type(factory).__name__}.group_builder returned a {type(builder).__name__}, not an EnvGroupBuilder"
        )
    return builder


def build_env_factory(
    name: str, values: Mapping[str, Any] | None = None, *, tokenizer: Any, where: str = "env"
) -> EnvFactory:
    """The ``ENV`` entry ``name``, built with ``tokenizer`` and its params from ``values``.

    ``where`` is the config key path errors name (``workflow.env_args``).
    """
    component = ENV.get(name)
    if not (isinstance(component, type) and issubclass(component, EnvFactory)):
        raise TrinityError(f"environment {name!r} is a {type(component).__name__}, not an EnvFactory class")
    params = build_params(component, values, where=where)
    return component(tokenizer=tokenizer, params=params) if params is not None else component(tokenizer=tokenizer)
