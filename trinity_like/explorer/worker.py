"""Where the explorer runs: in the driver's process, or as a Ray actor.

Both are an :class:`Explorer`: ``run`` a batch of tasks through the workflow, take new
weights with ``receive_weights``, and hand memory back between phases (``release_memory``,
``resume_memory``: a trainer on the same GPU takes it meanwhile). The pipeline holds one
and never asks which::

    explorer = ExplorerWorker(params, model_folder)          # or RemoteExplorer(params, model_folder)
    result = explorer.run(tasks, sampling)
    explorer.receive_weights(actor.export_weights(), version=1)   # a state dict, shared weights, or a folder

A crashed actor (OOM, a reward function that kills its process, a lost node) is not
restarted by Ray: the call raises :class:`~trinity_like.errors.WorkerDiedError`, and the run
restarts the stage -- this actor among its parts -- from its latest checkpoint
(:mod:`trinity_like.pipeline.restart`), so the batch is explored again exactly as before.

An explorer is built from :class:`ExplorerParams`, never from the recipe (a recipe's are made
by :func:`trinity_like.config.engine_params.explorer_params`): the ``ROLLOUT_ENGINE`` entry
:attr:`ExplorerParams.engine` (:mod:`.engines`) on :attr:`~ExplorerParams.device` in
:attr:`~ExplorerParams.dtype`, and the ``WORKFLOW`` entry :attr:`~ExplorerParams.workflow`. Ray is imported only by :class:`RemoteExplorer`:
an in-process explorer runs where Ray is not installed (a GPU machine with a small image).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, Union

from trinity_like import fault_points
from trinity_like.components import build_params, params_type
from trinity_like.cpu_share import EXPLORER, CoreShare
from trinity_like.errors import WorkerDiedError
from trinity_like.experience import Task
from trinity_like.plugins import load_plugins, ray_runtime_env
from trinity_like.trainer.shared_weights import SharedWeights, WeightMailbox

if TYPE_CHECKING:
    import torch

    from trinity_like.explorer.engine_contract import SamplingParams
    from trinity_like.explorer.workflows import WorkflowResult

# New weights for an explorer: a state dict, weights in shared memory
# (:mod:`~trinity_like.trainer.shared_weights`), or a model folder.
Weights = Union["dict[str, torch.Tensor]", SharedWeights, str, Path]


@dataclass(frozen=True)
class WorkflowSettings:
    """What a workflow is built from, as plain data (it crosses to a Ray actor before plugins load there)."""

    offered: Mapping[str, Any]  # the explorer's reward settings; the workflow takes those its params declare
    args: Mapping[str, Any]  # the workflow's own params (a recipe's explorer.workflow_args), over the offered ones


def build_workflow_params(cls: type, settings: WorkflowSettings) -> Any:
    """The params of the workflow class ``cls``: the offered settings it declares, then its own args."""
    ptype = params_type(cls)
    known = {f.name for f in dataclasses.fields(ptype)} if ptype else set()
    values = {k: v for k, v in settings.offered.items() if k in known}
    return build_params(cls, {**values, **settings.args}, where="explorer.workflow_args")


@dataclass(frozen=True)
class ExplorerParams:
    """What an explorer is built from (a recipe's: :func:`trinity_like.config.engine_params.explorer_params`)."""

    engine: str  # ROLLOUT_ENGINE name
    dtype: str  # rollout weights and KV cache: auto | float32 | bfloat16
    device: str  # where every model of the process runs: auto | cpu | cuda | cuda:N
    max_concurrent: int | None  # sequences decoded at once (cache slots); None: the engine sizes them
    workflow: str  # WORKFLOW name
    settings: WorkflowSettings  # the workflow's, for training batches
    eval_settings: WorkflowSettings | None  # for held-out evaluation; None: the same workflow as training
    threads: int | None = None  # torch threads of a Ray actor's process at a fixed width; None: leave them
    threads_alone: int | None = None  # ... its full width when it shares the cores with the trainer (cpu_share)


class Explorer(Protocol):
    """What the pipeline needs of an explorer, wherever it runs."""

    def run(self, tasks: list[Task], sampling: SamplingParams, evaluation: bool = False) -> WorkflowResult:
        """Sample and score ``tasks`` (with the evaluation reward when ``evaluation``)."""

    def receive_weights(self, weights: Weights, version: int) -> None:
        """Sample with ``weights`` from now on, recorded as model ``version``."""

    def release_memory(self) -> None:
        """Free the engine's between-calls memory (KV cache, graphs) for the trainer's phase."""

    def resume_memory(self) -> None:
        """The trainer's phase is over: the engine may take its memory again."""

    def close(self) -> None:
        """Free the model (and the actor)."""


def _state_dict(weights: Weights) -> tuple[dict, bool]:
    """A state dict from any :data:`Weights`, and whether it is a full one (a folder may omit tied weights)."""
    if isinstance(weights, SharedWeights):
        return weights.tensors(), True
    if isinstance(weights, (str, Path)):
        from safetensors.torch import load_file

        files = sorted(Path(weights).glob("*.safetensors"))
        if not files:  # a folder pruned under the reader: it asks for the newest again
            raise FileNotFoundError(f"no weights (*.safetensors) in {weights}")
        state: dict = {}
        for f in files:
            state.update(load_file(str(f)))
        return state, False
    return weights, True


class ExplorerWorker:
    """Rollout engine + workflow over a model folder; in-process, or the body of the Ray actor."""

    def __init__(
        self, params: ExplorerParams, model_path: str, num_threads: int | None = None, cores: CoreShare | None = None
    ) -> None:
        """``num_threads``: torch threads of this process (None: leave them); ``cores``: the
        board shared with the trainer (:mod:`trinity_like.cpu_share`), which sets them before
        every decode step instead."""
        import torch

        from trinity_like.explorer.engine_contract import EngineParams
        from trinity_like.explorer.engines import build_rollout_engine
        from trinity_like.models.device import set_run_device
        from trinity_like.registry import WORKFLOW

        load_plugins()
        set_run_device(params.device)  # in an actor too: env players and reward models follow it
        if num_threads:
            torch.set_num_threads(num_threads)
        # The prefix cache only for workflows whose later turns extend earlier ones: for single-turn
        # ones no prompt extends a finished sequence, and kept keys would only hold memory (up to
        # ~0.4 GB for SmolLM2) until the next sync.
        wf_cls = WORKFLOW.get(params.workflow)
        multi_turn = getattr(wf_cls, "reuses_prefixes", False)
        capacity = EngineParams(
            max_batch_size=params.max_concurrent,
            prefix_cache_tokens=EngineParams.prefix_cache_tokens if multi_turn else 0,
        )
        self.engine = build_rollout_engine(params.engine, model_path, dtype=params.dtype, params=capacity)
        self.workflow = wf_cls(params=build_workflow_params(wf_cls, params.settings))
        self.eval_workflow = (
            wf_cls(params=build_workflow_params(wf_cls, params.eval_settings))
            if params.eval_settings is not None
            else self.workflow
        )
        self.cores = cores
        if cores is not None:  # the engine paces its decode steps by the board
            self.engine.pace = functools.partial(cores.fit, EXPLORER)

    def run(self, tasks: list[Task], sampling: SamplingParams, evaluation: bool = False) -> WorkflowResult:
        fault_points.reach("explorer_run")
        workflow = self.eval_workflow if evaluation else self.workflow
        with self.cores.computing(EXPLORER) if self.cores is not None else contextlib.nullcontext():
            return workflow.run(tasks, engine=self.engine, sampling=sampling)

    def receive_weights(self, weights: Weights, version: int) -> None:
        from trinity_like.explorer.engine_contract import Borrowed

        state, full = _state_dict(weights)
        # Shared memory is borrowed -- sampled from where it lies, with no copy of the weights
        # here: the driver rewrites it only once this explorer has moved on to other weights. A
        # live state dict (the local engine's tensors, on the device when it trains on a GPU) is
        # copied, device to device: the trainer's optimiser writes it in place.
        self.engine.update_weights(
            Borrowed(state) if isinstance(weights, SharedWeights) else state, version=version, strict=full
        )

    def release_memory(self) -> None:
        self.engine.release_memory()

    def resume_memory(self) -> None:
        self.engine.resume_memory()

    def pid(self) -> int:
        return os.getpid()

    def close(self) -> None:
        if self.engine is not None:
            self.engine.close()
        self.engine = None


class RemoteExplorer:
    """An :class:`ExplorerWorker` in a Ray actor; its death is a :class:`WorkerDiedError`."""

    def __init__(self, params: ExplorerParams, model_path: str, cores: CoreShare | None = None) -> None:
        """``cores``: the board the actor shares the CPU cores through with the trainer (None: fixed width)."""
        import ray

        # Ray restarts no explorer: the run does, from its checkpoint (see the module doc)
        actor_cls = ray.remote(max_restarts=0, max_task_retries=0, num_cpus=0)(ExplorerWorker)
        width = params.threads_alone if cores is not None else params.threads
        env = ray_runtime_env({"env_vars": fault_points.env()})
        self.actor = actor_cls.options(runtime_env=env).remote(params, model_path, width, cores)
        self._mailbox: WeightMailbox | None = None  # where a state dict goes for the actor to read
        # Fail here, not mid-run, if the actor cannot start. The pid is kept: asking the actor
        # again would queue behind a batch it explores while the trainer trains.
        self._pid: int = ray.get(self.actor.pid.remote())

    def _call(self, method: str, *args: Any) -> Any:
        import ray
        from ray.exceptions import RayActorError

        try:
            return ray.get(getattr(self.actor, method).remote(*args))
        except RayActorError as exc:
            cause = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise WorkerDiedError(
                f"the explorer actor (pid {self._pid}) died during {method} ({cause})", "explorer"
            ) from None

    def run(self, tasks: list[Task], sampling: SamplingParams, evaluation: bool = False) -> WorkflowResult:
        return self._call("run", tasks, sampling, evaluation)

    def receive_weights(self, weights: Weights, version: int) -> None:
        """A state dict is written to this explorer's shared-memory mailbox, which the actor reads."""
        if isinstance(weights, dict):
            self._mailbox = self._mailbox or WeightMailbox()
            weights = self._mailbox.write(weights)
        self._call("receive_weights", weights, version)

    def release_memory(self) -> None:
        self._call("release_memory")

    def resume_memory(self) -> None:
        self._call("resume_memory")

    def pid(self) -> int:
        """The actor's process id."""
        return self._pid

    def close(self) -> None:
        import ray

        ray.kill(self.actor, no_restart=True)
        if self._mailbox is not None:
            self._mailbox.close()
