"""Metric sinks (MONITOR registry): a JSON Lines file and TensorBoard.

Every sink is a class built as ``Sink(run_dir=..., params=...)`` with ``log(step,
metrics)`` and ``close()``. Metrics are flat ``{"name/sub": float}`` dicts; a step's
record also carries wall time. Writes are flushed per step so a killed run keeps every
step it finished, and a resumed run first cuts the line a kill left torn
(:class:`~trinity_like.monitor.jsonl.JsonlAppender`).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trinity_like.monitor.jsonl import JsonlAppender, needs, read_file_records
from trinity_like.registry import MONITOR


@dataclass(frozen=True)
class JsonlParams:
    filename: str = "metrics.jsonl"  # file inside the run directory


@MONITOR.register_module("jsonl")
class JsonlMonitor:
    """One JSON object per step in <run_dir>/metrics.jsonl (flushed and fsynced each step)."""

    def __init__(self, *, run_dir: str, params: JsonlParams) -> None:
        self.path = Path(run_dir) / params.filename
        self._log = JsonlAppender(self.path, keep_open=True, fsync=True).open()  # closed by close()

    def log(self, step: int, metrics: dict[str, float]) -> None:
        self._log.append([{"step": step, "time": time.time(), **metrics}])  # a NaN is written as null

    def close(self) -> None:
        self._log.close()


GOLD_CHART = ("reward/mean", "reward/gold_mean")  # drawn on one chart (TensorBoard, `trinity-like plot`)


@dataclass(frozen=True)
class TensorBoardParams:
    subdir: str = "tensorboard"  # event files go to <run_dir>/<subdir>


@MONITOR.register_module("tensorboard")
class TensorBoardMonitor:
    """TensorBoard scalars in <run_dir>/tensorboard (`tensorboard --logdir runs`)."""

    def __init__(self, *, run_dir: str, params: TensorBoardParams) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir=str(Path(run_dir) / params.subdir))
        # One chart with the trained reward and the verifier's beside it (the CUSTOM SCALARS tab):
        # over-optimising a learned reward shows as the two lines parting.
        self.writer.add_custom_scalars({"reward": {"trained vs gold": ["Multiline", list(GOLD_CHART)]}})

    def log(self, step: int, metrics: dict[str, float]) -> None:
        for key, value in metrics.items():
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                self.writer.add_scalar(key, value, step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


METRICS_ROW = needs({"step": int})  # what makes a line of metrics.jsonl a step's record


def read_jsonl_metrics(path: str | os.PathLike, *, step: bool = False) -> list[dict[str, Any]]:
    """The records of a JSON Lines log, in order: a damaged line is skipped with a warning naming
    its file and line (on stderr), a torn last line left by a kill is skipped. ``step``: a record
    must have a whole-number ``step`` (a metrics file)."""
    return [r for _, r in read_file_records(path, METRICS_ROW if step else None).records]
