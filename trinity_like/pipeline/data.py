"""Data sources of a stage from its config: task sets (generators or files), offline sets."""

from __future__ import annotations

from dataclasses import fields
from typing import Any

from trinity_like.buffer.datasets import DatasetOptions, ExpertSet, PairSet, RowSet, SftSet, TaskSet
from trinity_like.config.schema import DatasetConfig
from trinity_like.experience import Task

_OPTION_FIELDS = {f.name for f in fields(DatasetOptions)}


def dataset_options(ds: DatasetConfig, *, epochs: int | None) -> DatasetOptions:
    values = {k: getattr(ds, k) for k in _OPTION_FIELDS if hasattr(ds, k) and k not in ("path", "epochs")}
    return DatasetOptions(path=ds.path or "", epochs=epochs, **values)


def generated_tasks(ds: DatasetConfig, where: str) -> list[Task]:
    """Tasks of the TASK_SOURCE ``ds.generator`` names (``where``: the dataset's key path, for errors)."""
    from trinity_like.explorer.tasks import task_source

    source, params = task_source(ds.generator or "", ds.generator_args, where)
    return list(source(split=ds.split, size=ds.size, seed=ds.seed, system_prompt=ds.system_prompt, params=params))


def task_set(ds: DatasetConfig, where: str, *, train: bool) -> RowSet[Task]:
    """A resumable, seeded task order: cycles for training, one pass for evaluation."""
    epochs = None if train else 1
    options = dataset_options(ds, epochs=epochs)
    if ds.path:
        tasks = TaskSet(options)
        return RowSet(tasks.rows[: ds.size], options, epochs=epochs) if ds.size else tasks
    rows = generated_tasks(ds, where)
    if not train:
        options = DatasetOptions(path="", shuffle=False, seed=ds.seed, epochs=1)
    return RowSet(rows, options, epochs=epochs)


def offline_set(ds: DatasetConfig, tokenizer: Any, *, schema: str, max_tokens: int, epochs: int | None) -> RowSet[Any]:
    """SFT rows or preference pairs of an offline algorithm, tokenized with the chat template."""
    options = dataset_options(ds, epochs=epochs)
    if schema == "pair":
        return PairSet(options, tokenizer, max_tokens=max_tokens)
    return SftSet(options, tokenizer, max_tokens=max_tokens)


def expert_set(ds: DatasetConfig, tokenizer: Any, *, max_tokens: int) -> ExpertSet:
    return ExpertSet(dataset_options(ds, epochs=None), tokenizer, max_tokens=max_tokens)
