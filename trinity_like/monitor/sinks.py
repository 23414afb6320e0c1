"""Metric sinks (MONITOR registry): a JSON Lines file and TensorBoard.

Every sink is a class built as ``Sink(run_dir=..., params=...)`` with ``log(step,
metrics)`` and ``close()``. Metrics are flat ``{"name/sub": float}`` dicts; a step's
record also carries wall time. Writes are flushed per step so a killed run keeps every
step it finished.
"""

from __future__ import annotations

import json
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path

from trinity_like.registry import MONITOR


@dataclass(frozen=True)
class JsonlParams:
    filename: str = "metrics.jsonl"  # file inside the run directory


@MONITOR.register_module("jsonl")
class JsonlMonitor:
    """One JSON object per step in <run_dir>/metrics.jsonl (flushed and fsynced each step)."""

    def __init__(self, *, run_dir: str, params: JsonlParams) -> None:
        self.path = Path(run_dir) / params.filename
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fh = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 -- held open for the run, closed by close()

    def log(self, step: int, metrics: dict[str, float]) -> None:
        clean = {
            k: (v if isinstance(v, (int, float)) and math.isfinite(v) else None if isinstance(v, float) else v)
            for k, v in metrics.items()
        }
        self._fh.write(json.dumps({"step": step, "time": time.time(), **clean}) + "\n")
        self._fh.flush()
        os.fsync(self._fh.fileno())

    def close(self) -> None:
        self._fh.close()


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


def read_jsonl_metrics(path: str | os.PathLike) -> list[dict]:
    """Read back a metrics file (skips a torn last line left by a kill)."""
    rows = []
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            line = line.strip()
            if not line:
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                break
    return rows
