"""What a stage reads: tasks for the explorer, rows for an offline trainer, expert rows, held-out sets.

Everything here is loaded and checked before a stage writes anything to its run directory,
so a bad data file is a one-line error with nothing half-written. Orders are resumable and
seeded: a :class:`~trinity_like.buffer.datasets.RowSet` saves its position with each checkpoint.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from trinity_like.buffer.base import ExpertSource
from trinity_like.buffer.datasets import DatasetOptions, ExpertSet, PairSet, RowSet, SftSet, TaskSet
from trinity_like.buffer.records import FieldError
from trinity_like.buffer.task_sources import task_source, with_task_ids
from trinity_like.config import ResolvedStage
from trinity_like.config.data_checks import dataset_options, system_prompt_of, with_hint
from trinity_like.config.schema import DatasetConfig
from trinity_like.errors import ConfigError, DataError, TrinityError
from trinity_like.experience import Task

T = TypeVar("T")


def hinted(options: DatasetOptions, where: str, load: Callable[[], T]) -> T:
    """``load()``; a row's missing or empty field names the option of ``where`` (``buffer.tasks``) that maps it."""
    try:
        return load()
    except FieldError as exc:
        raise DataError(with_hint(exc, where.removeprefix("buffer."), options)) from None


def generated_tasks(ds: DatasetConfig, where: str, system_prompt: str | None = None) -> list[Task]:
    """Tasks of the TASK_SOURCE ``ds.generator`` names (``where``: the dataset's key path, for errors;
    ``system_prompt``: the one in effect when ``ds`` sets none, :func:`~trinity_like.config.data_checks.system_prompt_of`)."""
    source, params = task_source(ds.generator or "", ds.generator_args, where)
    system = ds.system_prompt if ds.system_prompt is not None else system_prompt
    try:
        tasks = source(split=ds.split, size=ds.size, seed=ds.seed, system_prompt=system, params=params)
        return with_task_ids(tasks, generator=ds.generator or "", split=ds.split, seed=ds.seed, where=where)
    except ConfigError:
        raise
    except TrinityError as exc:  # a source's complaint is about this dataset's settings: name them
        raise ConfigError(f"{where}: {exc}") from None


def task_set(ds: DatasetConfig, where: str, *, train: bool, system_prompt: str | None = None) -> RowSet[Task]:
    """A resumable, seeded task order: cycles for training, one pass for evaluation (``system_prompt``:
    the one in effect when ``ds`` sets none)."""
    epochs = None if train else 1
    options = dataset_options(ds, epochs=epochs, system_prompt=system_prompt)
    if ds.path:
        tasks = hinted(options, where, lambda: TaskSet(options))
        return RowSet(tasks.rows[: ds.size], options, epochs=epochs) if ds.size else tasks
    rows = generated_tasks(ds, where, system_prompt)
    if not train:
        options = DatasetOptions(path="", shuffle=False, seed=ds.seed, epochs=1)
    return RowSet(rows, options, epochs=epochs)


def offline_set(
    ds: DatasetConfig,
    tokenizer: Any,
    *,
    schema: str,
    max_tokens: int,
    epochs: int | None,
    where: str = "buffer.train_data",
    system_prompt: str | None = None,
) -> RowSet[Any]:
    """SFT rows or preference pairs of an offline algorithm, tokenized with the chat template."""
    options = dataset_options(ds, epochs=epochs, system_prompt=system_prompt)
    kind = PairSet if schema == "pair" else SftSet
    return hinted(options, where, lambda: kind(options, tokenizer, max_tokens=max_tokens))


def expert_set(ds: DatasetConfig, tokenizer: Any, *, max_tokens: int) -> ExpertSet:
    options = dataset_options(ds, epochs=None)
    return hinted(options, "buffer.expert_data", lambda: ExpertSet(options, tokenizer, max_tokens=max_tokens))


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


def source_tasks(source: Any, where: str, system_prompt: str | None = None) -> list[Task]:
    """The tasks a ``pairs_from_samples`` source names (loaded up front: bad data fails before any sampling)."""
    plain = source.model_copy(update={"pairs_from_samples": None})
    return list(task_set(plain, where, train=False, system_prompt=system_prompt))


def offline_rows(spec: ResolvedStage, key: str, source: Any, tokenizer: Any) -> RowSet[Any]:
    """SFT rows or pairs of ``buffer.<key>``: training data cycles, held-out data is one pass."""
    cfg = spec.config
    max_tokens = cfg.model.max_prompt_tokens + cfg.model.max_response_tokens
    epochs = None if key == "train_data" else 1
    system = system_prompt_of(cfg.buffer, key)
    return offline_set(
        source,
        tokenizer,
        schema=spec.algorithm.schema,
        max_tokens=max_tokens,
        epochs=epochs,
        where=f"buffer.{key}",
        system_prompt=system,
    )


def load_stage_data(spec: ResolvedStage, role: str, tokenizer: Any) -> StageData:
    """The data ``role`` reads (see :mod:`.build`), loaded and validated."""
    cfg, buf = spec.config, spec.config.buffer
    data = StageData()
    evaluates = cfg.monitor.eval_interval != 0  # 0: never (held-out sets not even loaded)
    if buf.eval_tasks is not None and role != "train" and evaluates:
        system = system_prompt_of(buf, "eval_tasks")  # the training tasks' when unset: one setting for both
        data.eval_tasks = list(task_set(buf.eval_tasks, "buffer.eval_tasks", train=False, system_prompt=system))
    if role in ("both", "explore"):
        data.train = task_set(buf.tasks, "buffer.tasks", train=True)
    if role in ("both", "train") and buf.expert_data is not None:
        max_tokens = cfg.model.max_prompt_tokens + cfg.model.max_response_tokens
        data.expert = expert_set(buf.expert_data, tokenizer, max_tokens=max_tokens)
    if role != "offline":
        return data
    for key in ("train_data", "eval_data"):
        source = getattr(buf, key)
        if source is None or (key == "eval_data" and not evaluates):
            continue
        if source.pairs_from_samples:
            data.pair_tasks[key] = source_tasks(source, f"buffer.{key}", system_prompt_of(buf, key))
        elif key == "train_data":
            data.train = offline_rows(spec, key, source, tokenizer)
        else:
            data.eval_rows = list(offline_rows(spec, key, source, tokenizer))
    return data
