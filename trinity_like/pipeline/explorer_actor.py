"""The explorer in its own process: a Ray actor holding the rollout engine and the workflow.

The driver keeps the task order (its position is checkpointed) and sends each step's
tasks; the actor samples, scores and returns experiences. Weights arrive through Ray's
object store (``ray.put`` once per sync, shared by reference) or, with
``synchronizer.method: checkpoint``, as a folder of the weight channel (:mod:`.sync`).

A crashed actor (OOM, a reward function that kills its process, a lost node) is restarted
by Ray (``max_restarts``); :class:`RemoteExplorer` then re-sends the latest weights and
retries the call, so the run goes on. Each restart is counted in the metrics.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import ray
from ray.exceptions import RayActorError

from trinity_like.errors import TrinityError
from trinity_like.plugins import load_plugins, ray_runtime_env

MAX_RESTARTS = 3


class ExplorerWorker:
    """Rollout engine + workflow over a model folder; run in-process or as a Ray actor."""

    def __init__(self, config: Any, model_path: str, num_threads: int | None = None) -> None:
        import torch

        from trinity_like.explorer.engine import EngineParams, RolloutEngine
        from trinity_like.models.resolve import load_model
        from trinity_like.pipeline.context import workflow_params
        from trinity_like.registry import WORKFLOW

        load_plugins()
        if num_threads:
            torch.set_num_threads(num_threads)
        cfg = config
        model, tokenizer = load_model(model_path, dtype=getattr(torch, cfg.explorer.dtype))
        self.engine = RolloutEngine(model, tokenizer, EngineParams(max_batch_size=cfg.explorer.max_concurrent))
        wf_cls = WORKFLOW.get(cfg.explorer.workflow)
        self.workflow = wf_cls(params=workflow_params(cfg, wf_cls))
        self.eval_workflow = (
            wf_cls(params=workflow_params(cfg, wf_cls, evaluation=True)) if cfg.explorer.eval_reward_fn else self.workflow
        )

    def run(self, tasks: list, sampling: Any, evaluation: bool = False) -> Any:
        workflow = self.eval_workflow if evaluation else self.workflow
        return workflow.run(tasks, engine=self.engine, sampling=sampling)

    def update_weights(self, state_dict: dict, version: int) -> int:
        return self.engine.update_weights(state_dict, version=version)

    def load_weights(self, folder: str, version: int) -> int:
        from safetensors.torch import load_file

        state: dict = {}
        for f in sorted(Path(folder).glob("*.safetensors")):
            state.update(load_file(str(f)))
        return self.engine.update_weights(state, version=version, strict=False)

    def pid(self) -> int:
        return os.getpid()


class RemoteExplorer:
    """Driver-side handle of an :class:`ExplorerWorker` actor with crash recovery."""

    def __init__(self, config: Any, model_path: str) -> None:
        actor_cls = ray.remote(max_restarts=MAX_RESTARTS, max_task_retries=0, num_cpus=0)(ExplorerWorker)
        self.actor = actor_cls.options(runtime_env=ray_runtime_env()).remote(config, model_path, os.cpu_count())
        self._weights: tuple[str, Any, int] | None = None  # ("memory", ref, version) or ("checkpoint", folder, version)
        self.restarts = 0
        ray.get(self.actor.pid.remote())  # fail here, not mid-run, if the actor cannot start

    def _call(self, method: str, *args: Any) -> Any:
        for attempt in range(MAX_RESTARTS + 1):
            try:
                return ray.get(getattr(self.actor, method).remote(*args))
            except RayActorError as exc:
                if attempt == MAX_RESTARTS:
                    raise TrinityError(f"the explorer actor crashed {attempt + 1} times; last: {exc}") from None
                self.restarts += 1
                self._wait_alive()
                self._resend_weights()
        raise AssertionError("unreachable")

    def _wait_alive(self) -> None:
        for _ in range(600):
            try:
                ray.get(self.actor.pid.remote(), timeout=60)
                return
            except RayActorError:
                time.sleep(0.5)
        raise TrinityError("the explorer actor did not come back after a crash")

    def _resend_weights(self) -> None:
        if self._weights is None:
            return
        kind, value, version = self._weights
        method = self.actor.update_weights if kind == "memory" else self.actor.load_weights
        ray.get(method.remote(value, version))

    def run(self, tasks: list, sampling: Any, evaluation: bool = False) -> Any:
        return self._call("run", tasks, sampling, evaluation)

    def update_weights(self, state_dict: dict | ray.ObjectRef, version: int) -> None:
        """New weights: a state dict, or a reference to one already in the object store."""
        ref = state_dict if isinstance(state_dict, ray.ObjectRef) else ray.put(state_dict)
        self._weights = ("memory", ref, version)
        self._call("update_weights", ref, version)

    def load_weights(self, folder: str, version: int) -> None:
        self._weights = ("checkpoint", folder, version)
        self._call("load_weights", folder, version)

    def pid(self) -> int:
        return self._call("pid")

    def close(self) -> None:
        ray.kill(self.actor, no_restart=True)
