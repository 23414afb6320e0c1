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

The built-in sources (``arithmetic``, ``reasoning_gym``) are in :mod:`trinity_like.explorer.tasks`.
The lookup lives here, below the config, so that validating a recipe
(:mod:`trinity_like.config.resolve`) and loading a stage's data
(:mod:`trinity_like.pipeline.data_sources`) share it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import fields
from typing import Any

from trinity_like.components import build_params, params_type
from trinity_like.errors import ConfigError, TrinityError
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
