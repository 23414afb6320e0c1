"""What a stage reads: tasks for the explorer, rows for an offline trainer, expert rows, held-out sets.

Everything here is loaded and checked before a stage writes anything to its run directory,
so a bad data file is a one-line error with nothing half-written. Orders are resumable and
seeded: a :class:`~trinity_like.buffer.datasets.RowSet` saves its position with each checkpoint.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from trinity_like.buffer.base import ExpertSource
from trinity_like.buffer.datasets import RowSet
from trinity_like.config import ResolvedStage
from trinity_like.experience import Task
from trinity_like.pipeline.data import expert_set, offline_set, task_set


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
    """The data ``role`` reads (see :mod:`.stage`), loaded and validated."""
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
