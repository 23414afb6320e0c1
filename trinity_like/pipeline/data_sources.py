"""What a stage reads: tasks for the explorer, rows for an offline trainer, expert rows, held-out sets.

Everything here is loaded and checked before a stage writes anything to its run directory,
so a bad data file is a one-line error with nothing half-written. Orders are resumable and
seeded: a :class:`~trinity_like.buffer.datasets.RowSet` saves its position with each checkpoint.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

from trinity_like.buffer.base import ExpertSource
from trinity_like.buffer.datasets import DatasetOptions, ExpertSet, PairSet, RowSet, SftSet, TaskSet
from trinity_like.buffer.task_sources import task_source, with_task_ids
from trinity_like.config import ResolvedStage
from trinity_like.config.schema import DatasetConfig
from trinity_like.errors import ConfigError, TrinityError
from trinity_like.experience import Task

_OPTION_FIELDS = {f.name for f in fields(DatasetOptions)}


def dataset_options(ds: DatasetConfig, *, epochs: int | None) -> DatasetOptions:
    values = {k: getattr(ds, k) for k in _OPTION_FIELDS if hasattr(ds, k) and k not in ("path", "epochs")}
    return DatasetOptions(path=ds.path or "", epochs=epochs, **values)


def generated_tasks(ds: DatasetConfig, where: str) -> list[Task]:
    """Tasks of the TASK_SOURCE ``ds.generator`` names (``where``: the dataset's key path, for errors)."""
    source, params = task_source(ds.generator or "", ds.generator_args, where)
    try:
        tasks = source(split=ds.split, size=ds.size, seed=ds.seed, system_prompt=ds.system_prompt, params=params)
        return with_task_ids(tasks, generator=ds.generator or "", split=ds.split, seed=ds.seed, where=where)
    except ConfigError:
        raise
    except TrinityError as exc:  # a source's complaint is about this dataset's settings: name them
        raise ConfigError(f"{where}: {exc}") from None


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


@dataclass
class StageData:
    """A stage's data sources; the ones its role does not read stay None."""

    train: RowSet[Any] | None = None  # online: tasks the explorer answers; offline: SFT rows or pairs (cycled)
    eval_tasks: list[Task] | None = None  # held-out tasks for answer accuracy (greedy by default)
    expert: ExpertSource | None = None  # expert rows a sample strategy mixes into RL batches (MIX)
    eval_rows: list[Any] = field(default_factory=list)  # offline held-out rows: SFT loss, pair accuracy
    # offline: buffer keys ("train_data", "eval_data") whose pairs come from the starting model's own
    # answers to these tasks; they become rows once the run directory exists (:mod:`.self_pairs`)
    pair_tasks: dict[str, list[Task]] = field(default_factory=dict)
    summary: dict[str, float] = field(default_factory=dict)  # counts logged at step 0 (pairs built, ...)


def source_tasks(source: Any, where: str) -> list[Task]:
    """The tasks a ``pairs_from_samples`` source names (loaded up front: bad data fails before any sampling)."""
    return list(task_set(source.model_copy(update={"pairs_from_samples": None}), where, train=False))


def offline_rows(spec: ResolvedStage, key: str, source: Any, tokenizer: Any) -> RowSet[Any]:
    """SFT rows or pairs of ``buffer.<key>``: training data cycles, held-out data is one pass."""
    cfg = spec.config
    max_tokens = cfg.model.max_prompt_tokens + cfg.model.max_response_tokens
    epochs = None if key == "train_data" else 1
    return offline_set(source, tokenizer, schema=spec.algorithm.schema, max_tokens=max_tokens, epochs=epochs)


def load_stage_data(spec: ResolvedStage, role: str, tokenizer: Any) -> StageData:
    """The data ``role`` reads (see :mod:`.build`), loaded and validated."""
    cfg, buf = spec.config, spec.config.buffer
    data = StageData()
    if buf.eval_tasks is not None and role != "train":
        data.eval_tasks = list(task_set(buf.eval_tasks, "buffer.eval_tasks", train=False))
    if role in ("both", "explore"):
        data.train = task_set(buf.tasks, "buffer.tasks", train=True)
    if role in ("both", "train") and buf.expert_data is not None:
        max_tokens = cfg.model.max_prompt_tokens + cfg.model.max_response_tokens
        data.expert = expert_set(buf.expert_data, tokenizer, max_tokens=max_tokens)
    if role != "offline":
        return data
    for key in ("train_data", "eval_data"):
        source = getattr(buf, key)
        if source is None:
            continue
        if source.pairs_from_samples:
            data.pair_tasks[key] = source_tasks(source, f"buffer.{key}")
        elif key == "train_data":
            data.train = offline_rows(spec, key, source, tokenizer)
        else:
            data.eval_rows = list(offline_rows(spec, key, source, tokenizer))
    return data
