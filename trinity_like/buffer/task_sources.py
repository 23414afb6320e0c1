"""Generated data sets: looking a task source (TASK_SOURCE) up by the name a recipe gives it.

A recipe names a task source in ``buffer.<key>.generator``; plugins register their own
the same way (``@TASK_SOURCE.register_module("my_tasks")``). A source is a function (or a
class) called with the dataset config's ``split`` ("train" | "eval"), ``size`` (None: the
source's default), ``seed`` and ``system_prompt`` (None: the source's default), and
``params``, its own frozen dataclass built from ``generator_args`` (unknown args are
errors naming ``buffer.<key>.generator_args.<arg>``); it returns the tasks (any iterable
of :class:`~trinity_like.experience.Task`). ``generator: "<name>:<dataset>"`` is short for
``generator: <name>`` with ``generator_args: {dataset: <dataset>}``, for a source whose
params have a ``dataset`` field (``reasoning_gym:gsm_symbolic``)::

    @dataclass(frozen=True)
    class CountParams:
        upto: int = 10  # largest number asked for

    @TASK_SOURCE.register_module("count")
    def count_tasks(*, split, size, seed, system_prompt, params: CountParams):
        \"\"\"'What comes after n?' for n < upto.\"\"\"
        return [Task(prompt=f"What comes after {n}?", answer=str(n + 1), system_prompt=system_prompt)
                for n in range(params.upto)][:size]

Every task needs its own ``task_id`` (held-out answers in ``evals.jsonl``, a step's rows in
the buffer and its skipped tasks are keyed by it): a task a source returns without one gets
``<source>-<split>-<seed>-<index>`` (:func:`with_task_ids`: stable, as the source's order is),
and two tasks with the same id are an error naming the source.

The built-in sources (``arithmetic``, ``reasoning_gym``) are in :mod:`trinity_like.explorer.tasks`.
The lookup lives here, below the config, so that validating a recipe
(:mod:`trinity_like.config.resolve`) and loading a stage's data
(:mod:`trinity_like.pipeline.data_sources`) share it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from dataclasses import fields
from typing import Any

from trinity_like.components import build_params, params_type
from trinity_like.errors import ConfigError, TrinityError
from trinity_like.experience import Task
from trinity_like.registry import TASK_SOURCE, UnknownNameError


def task_source(generator: str, generator_args: Mapping[str, Any], where: str) -> tuple[Any, Any]:
    """The TASK_SOURCE entry ``generator`` names and its params object built from ``generator_args``.

    ``where`` is the dataset's key path (``buffer.tasks``); errors are one line naming
    ``<where>.generator`` or ``<where>.generator_args.<arg>``.
    """
    name, colon, dataset = generator.partition(":")
    try:
        source = TASK_SOURCE.get(name)
    except UnknownNameError as exc:
        raise ConfigError(f"{where}.generator: {exc}") from None
    args = dict(generator_args)
    if colon:
        ptype = params_type(source)
        if ptype is None or "dataset" not in {f.name for f in fields(ptype)}:
            raise ConfigError(f"{where}.generator: task source {name!r} takes no ':<dataset>' part (got {generator!r})")
        if "dataset" in args:
            raise ConfigError(f"{where}.generator_args.dataset: set twice (also in generator {generator!r})")
        args["dataset"] = dataset
    try:
        return source, build_params(source, args, where=f"{where}.generator_args")
    except ConfigError:
        raise
    except TrinityError as exc:  # the params object's own checks (ArithmeticParams.__post_init__)
        raise ConfigError(f"{where}.generator_args: {exc}") from None


def with_task_ids(tasks: Iterable[Any], *, generator: str, split: str, seed: int, where: str) -> list[Task]:
    """``tasks`` as a list, each with a distinct ``task_id``: one a source left empty becomes
    ``<source>-<split>-<seed>-<index>`` (its position in the source's list); a value that is not
    a Task, or an id two tasks share, is a ConfigError naming ``<where>.generator``.

    >>> [t.task_id for t in with_task_ids([Task("a"), Task("b", task_id="mine")], generator="count",
    ...                                    split="eval", seed=0, where="buffer.eval_tasks")]
    ['count-eval-0-0', 'mine']
    >>> with_task_ids([Task("a", task_id="x"), Task("b", task_id="x")], generator="count", split="train",
    ...               seed=0, where="buffer.tasks")
    Traceback (most recent call last):
    ...
    trinity_like.errors.ConfigError: buffer.tasks.generator: task source 'count' gave tasks 0 and 1 the same task_id 'x'; each task needs its own
    """
    name = generator.partition(":")[0]
    out: list[Task] = []
    first: dict[str, int] = {}
    for index, task in enumerate(tasks):
        if not isinstance(task, Task):
            raise ConfigError(f"{where}.generator: task source {name!r} gave a {type(task).__name__}, not a Task")
        if not task.task_id:
            task = dataclasses.replace(task, task_id=f"{name}-{split}-{seed}-{index}")
        if task.task_id in first:
            raise ConfigError(
                f"{where}.generator: task source {name!r} gave tasks {first[task.task_id]} and {index} the same "
                f"task_id {task.task_id!r}; each task needs its own"
            )
        first[task.task_id] = index
        out.append(task)
    return out
