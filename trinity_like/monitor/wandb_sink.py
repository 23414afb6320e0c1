"""Weights & Biases as a metrics sink (MONITOR ``wandb``), offline unless told otherwise.

``monitor.backends: [jsonl, wandb]`` sends every step's metrics to a W&B run beside the
JSONL file. The run is *offline* by default (``WANDB_MODE`` unset: ``offline``): nothing
leaves the machine, and ``wandb sync <run_dir>/wandb/offline-run-*`` uploads it later;
``WANDB_MODE=online`` logs live. W&B's own variables choose the rest (``WANDB_PROJECT``,
default ``trinity-like``; ``WANDB_ENTITY``, ``WANDB_DIR``, default the run directory).
The run is named after the run directory, or ``TRINITY_LIKE_RUN_NAME`` and grouped by
``TRINITY_LIKE_RUN_GROUP`` when set (``trinity-like compare`` sets both: recipe/seed, recipe).

Needs the optional package: ``pip install 'trinity-like[trackers]'``.
"""

from __future__ import annotations

import importlib
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trinity_like.errors import TrinityError
from trinity_like.registry import MONITOR

EXTRA = "trinity-like[trackers]"
NAME_ENV, GROUP_ENV = "TRINITY_LIKE_RUN_NAME", "TRINITY_LIKE_RUN_GROUP"


def import_optional(module: str, sink: str) -> Any:
    """``module``, or a one-line error naming the extra that installs it."""
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if exc.name and exc.name.split(".")[0] == module.split(".")[0]:
            raise TrinityError(
                f"monitor.backends: {sink!r} needs the {module.split('.')[0]} package: pip install '{EXTRA}'"
            ) from None
        raise


def numeric(metrics: dict[str, Any]) -> dict[str, float]:
    """The finite numbers of a step's metrics (trackers take numbers; None, text and flags are left out)."""
    return {
        k: float(v)
        for k, v in metrics.items()
        if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
    }


def run_name(run_dir: str) -> str:
    return os.environ.get(NAME_ENV) or Path(run_dir).name


@dataclass(frozen=True)
class WandbParams:
    project: str = "trinity-like"  # W&B project, unless WANDB_PROJECT is set


@MONITOR.register_module("wandb")
class WandbMonitor:
    """Weights & Biases run per process (offline by default: WANDB_MODE=offline; pip install trinity-like[trackers])."""

    def __init__(self, *, run_dir: str, params: WandbParams) -> None:
        wandb = import_optional("wandb", "wandb")
        self.run = wandb.init(
            project=os.environ.get("WANDB_PROJECT") or params.project,
            dir=os.environ.get("WANDB_DIR") or run_dir,
            name=os.environ.get("WANDB_NAME") or run_name(run_dir),
            group=os.environ.get("WANDB_RUN_GROUP") or os.environ.get(GROUP_ENV) or None,
            mode=os.environ.get("WANDB_MODE") or "offline",
            config={"run_dir": str(Path(run_dir).resolve())},
            reinit="create_new",  # a process with several stages logs each to a run of its own
            settings=wandb.Settings(quiet=True),  # the run's own progress bar is what a person reads
        )

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        values = numeric(metrics)
        if values:  # a step's lines (metrics, checkpoint time, evaluation) merge into one W&B row
            self.run.log(values, step=step)

    def close(self) -> None:
        self.run.finish()
