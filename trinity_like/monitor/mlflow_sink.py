"""MLflow as a metrics sink (MONITOR ``mlflow``), into a local file store by default.

``monitor.backends: [jsonl, mlflow]`` sends every step's metrics to an MLflow run. The
tracking store is ``MLFLOW_TRACKING_URI`` when set, else a local file store beside the run
directory (``<run_root>/mlruns``: every run of a run root in one store, ``mlflow ui
--backend-store-uri runs/mlruns``); nothing goes over the network unless the URI says so.
The experiment is ``MLFLOW_EXPERIMENT_NAME``, default ``trinity-like``; the run is named
after the run directory, or ``TRINITY_LIKE_RUN_NAME``, and tagged with
``TRINITY_LIKE_RUN_GROUP`` (``trinity-like compare`` sets both, and points every compared
run at ``<out>/mlruns``).

MLflow 3 keeps its file store in maintenance mode and refuses it unless
``MLFLOW_ALLOW_FILE_STORE=true``: this sink sets that for a ``file:`` store it opens.

Needs the optional package: ``pip install 'trinity-like[trackers]'`` (``mlflow-skinny``).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trinity_like.monitor.wandb_sink import GROUP_ENV, import_optional, numeric, run_name
from trinity_like.registry import MONITOR


@dataclass(frozen=True)
class MlflowParams:
    experiment: str = "trinity-like"  # MLflow experiment, unless MLFLOW_EXPERIMENT_NAME is set


def tracking_uri(run_dir: str) -> str:
    """``MLFLOW_TRACKING_URI``, else ``file:`` ``<run_dir>/../mlruns``."""
    return os.environ.get("MLFLOW_TRACKING_URI") or (Path(run_dir).resolve().parent / "mlruns").as_uri()


@MONITOR.register_module("mlflow")
class MlflowMonitor:
    """MLflow run per process, local file store by default (<run_root>/mlruns; pip install trinity-like[trackers])."""

    def __init__(self, *, run_dir: str, params: MlflowParams) -> None:
        import_optional("mlflow", "mlflow")
        from mlflow.exceptions import MlflowException
        from mlflow.tracking import MlflowClient

        uri = tracking_uri(run_dir)
        if uri.startswith("file:"):
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        self.client = MlflowClient(tracking_uri=uri)
        name = os.environ.get("MLFLOW_EXPERIMENT_NAME") or params.experiment
        experiment = self.client.get_experiment_by_name(name)
        if experiment is None:
            try:
                experiment_id = self.client.create_experiment(name)
            except MlflowException:  # another run may have created it between the two calls (runs started together)
                found = self.client.get_experiment_by_name(name)
                if found is None:
                    raise
                experiment_id = found.experiment_id
        else:
            experiment_id = experiment.experiment_id
        tags = {"trinity_like.run_dir": str(Path(run_dir).resolve())}
        if os.environ.get(GROUP_ENV):
            tags["trinity_like.group"] = os.environ[GROUP_ENV]
        self.run_id = self.client.create_run(experiment_id, run_name=run_name(run_dir), tags=tags).info.run_id
        self.uri = uri

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        batch = [Metric(key, value, now, step) for key, value in numeric(metrics).items()]
        if batch:
            self.client.log_batch(self.run_id, metrics=batch)

    def close(self) -> None:
        self.client.set_terminated(self.run_id)
