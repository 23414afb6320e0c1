"""The ``verl`` train engine: verl 0.9.1's FSDP training workers driven through Ray.

Workers are verl's engine-based ``TrainingWorker`` (see ``verl_worker.py``; their
configuration and our :class:`VerlParams` in ``verl_config.py``, Ray and the workers'
placement in ``verl_ray.py``), created with
verl's own single-controller classes (``RayResourcePool``, ``RayClassWithInitArgs``,
``RayWorkerGroup``); the model is sharded with FSDP2 over ``num_workers`` data-parallel
ranks -- nccl on GPUs, gloo on CPU through ``verl_cpu``. The same class serves the actor
(``kind="lm"``), the reference policy (``forward_only=True``: no optimiser is built), a
critic (``kind="value"``: verl's value-model engine, a one-label token classifier) and a
reward model (``kind="reward"``: the same engine, read at each sequence's last token).
With ``ModelParams.lora`` the actor trains a LoRA adapter through verl's own peft support,
from the same seeded start as the local engine (``tests/trainer/test_verl_engine.py``).

Our loss callable runs in the workers: ``set_loss_fn`` ships it to every worker, which
calls it per micro-batch on the outputs of our forward (:mod:`~trinity_like.trainer.forward`,
run inside verl's FSDP module). The batch is split into ``num_workers`` equal row blocks
on the driver.

Ray starts a new local instance (``ray.init(address="local")`` with ``num_cpus``; never a
cluster that ``ray start`` left on this machine, which a bare ``ray.init()`` would join)
unless ``ray_address`` names a cluster or Ray is already initialised in this process. The engine that started Ray shuts it down
in :meth:`VerlEngine.close`, so a process holding several engines (actor, reference,
critic) should start Ray itself, or close the first-started engine last. GPUs or gloo is
decided by the cluster: with at least ``num_workers`` GPUs the workers run verl unpatched.

Example::

    engine = VerlEngine(ModelParams(path="tiny"), OptimParams(lr=1e-4), VerlParams(num_workers=2))
    engine.forward_backward(batch, loss_fn)
    engine.optim_step()
    engine.close()
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import ray
import torch

from trinity_like import fault_points
from trinity_like.errors import TrinityError
from trinity_like.plugins import ray_runtime_env
from trinity_like.trainer import lora as lora_lib
from trinity_like.trainer import verl_cpu
from trinity_like.trainer.base import (
    Batch,
    LossCallable,
    batch_rows,
    mean_metrics,
    row_unit,
    slice_rows,
    with_normalisers,
)
from trinity_like.trainer.forward import packing_metrics
from trinity_like.trainer.params import AdamStep, ModelParams, OptimParams
from trinity_like.trainer.shared_weights import SharedWeights, WeightMailbox
from trinity_like.trainer.verl_config import VerlParams, worker_config
from trinity_like.trainer.verl_ray import check_free_resources, check_reachable, placement_group_for, start_ray
from trinity_like.trainer.verl_watch import gather

# Where the pieces live: placement and Ray in verl_ray, parameters and verl's worker config in
# verl_config; the names callers import from here are re-exported.
__all__ = [
    "VerlEngine",
    "VerlParams",
    "check_free_resources",
    "check_reachable",
    "pad_rows",
    "split_over_workers",
    "start_ray",
]


DEFAULT_VERL = VerlParams()  # frozen: one shared default


def check_model_folder(path: str) -> None:
    if not (Path(path) / "config.json").is_file():
        raise TrinityError(f"model folder {path!r} not found (no config.json there)")


def pad_rows(batch: Batch, multiple: int) -> Batch:
    """Pad a batch to a multiple of ``multiple`` rows with copies of its last row whose
    ``response_mask`` is zero: they add nothing to any masked loss (the whole-batch
    normalisers were fixed before) and let every rank run the same micro-batches."""
    rows = batch_rows(batch)
    extra = -rows % multiple
    if extra == 0:
        return batch
    out: Batch = {}
    for key, value in batch.items():
        if value.dim() == 0:
            out[key] = value
            continue
        pad = value[-1:].expand(extra, *value.shape[1:]).clone()
        if key == "response_mask":
            pad.zero_()
        out[key] = torch.cat([value, pad])
    return out


def split_over_workers(batch: Batch, workers: int) -> list[Batch]:
    """Equal row blocks, one per worker: every rank must run the same number of micro-batches
    (FSDP's collectives pair them up). A batch that does not divide evenly is padded with
    masked rows (:func:`pad_rows`); outputs of padded rows are dropped by the caller."""
    batch = pad_rows(batch, workers * row_unit(batch))  # whole examples (pairs) per worker
    rows = batch_rows(batch)
    step = rows // workers
    return [slice_rows(batch, i * step, (i + 1) * step) for i in range(workers)]


class VerlEngine:
    """A :class:`~trinity_like.trainer.base.TrainEngine` over a group of verl FSDP workers."""

    def __init__(self, model: ModelParams, optim: OptimParams = OptimParams(), verl: VerlParams = DEFAULT_VERL) -> None:
        check_model_folder(model.path)  # before Ray starts: a typo fails in a second
        self._started_ray = start_ray(verl)
        # GPUs are the cluster's, not the driver's: a CPU-only driver may drive GPU workers.
        # Without GPUs, verl's CPU registration runs here and in the workers.
        self.use_gpu = verl.use_gpu
        check_free_resources(verl.num_workers, "GPU" if self.use_gpu else "CPU", verl.placement)
        if not self.use_gpu:
            verl_cpu.install()
        config = worker_config(model, optim, verl, self.use_gpu)
        from verl.single_controller.ray import RayClassWithInitArgs, RayResourcePool, RayWorkerGroup

        from trinity_like.trainer.verl_worker import TrinityVerlWorker

        self.params, self.verl_params = model, verl
        self.pool = RayResourcePool(process_on_nodes=[verl.num_workers], use_gpu=self.use_gpu, max_colocate_count=1)
        # verl builds the group's placement group itself, always STRICT_PACK (bin_pack=True) or
        # PACK: a pool whose group exists already uses it (RayResourcePool.get_placement_groups),
        # so ours carries the strategy of cluster.placement. Spread over nodes, the ranks still
        # meet at bundle 0's node (verl's MASTER_ADDR) over gloo, or nccl on GPUs.
        self.pool.pgs = [placement_group_for(verl.num_workers, self.use_gpu, verl.placement)]
        worker_env = dict(ray_runtime_env()["env_vars"])
        worker_env.update(fault_points.env())  # a fault test's kill point inside a worker (verl_worker_update)
        if not self.use_gpu:
            worker_env.update(verl_cpu.worker_env())
        worker_cls = RayClassWithInitArgs(
            cls=ray.remote(TrinityVerlWorker),
            config=config,
            kind=model.kind,
            lora=model.adapter,
            share_prompts=model.share_prompts,
            num_threads=verl.threads,
            cores=verl.cores,
        )
        self.group = RayWorkerGroup(
            resource_pool=self.pool,
            ray_cls_with_init=worker_cls,
            worker_env=worker_env,
            device_name="cuda" if self.use_gpu else "cpu",
        )
        self.group.reset()  # verl builds the model, FSDP wrapping, optimiser and scheduler here
        self.device = torch.device("cpu")  # the weights reach the driver in shared memory (export_weights)
        self.pids: list[int] = []
        self.pids = list(self._call("trinity_pid", "start-up"))  # the workers' processes (memory metrics, errors)
        if model.adapter is not None:
            self._call(
                "trinity_init_adapter", "start-up"
            )  # the local engine's seeded start, in place of verl's own draw
        self._loss_fn: LossCallable | None = None
        self.mailbox = WeightMailbox()  # export_weights writes here (rank 0 on the driver's machine)

    @property
    def architecture(self) -> str:
        """The class the folder's ``config.json`` names (the model itself lives in the workers)."""
        from transformers import AutoConfig

        names = AutoConfig.from_pretrained(self.params.path).architectures or []
        return names[0] if names else ""

    def _call(self, method: str, what: str, *args: Any) -> list[Any]:
        """``method`` on every worker; a worker that dies meanwhile stops the run at once (:mod:`.verl_watch`)."""
        return gather(getattr(self.group, method)(*args), what, self.pids)

    # -- the contract --------------------------------------------------------------
    def forward_backward(
        self,
        batch: Batch,
        loss_fn: LossCallable,
        *,
        need_entropy: bool = False,
        out: dict[str, torch.Tensor] | None = None,
    ) -> dict[str, float]:
        """Forward/backward on every worker; returns the full-batch loss and mean metrics.

        ``out``, when given, receives the outputs of every row (``logprob [B, R]``, ...)."""
        if self.params.forward_only:
            raise TrinityError("forward_backward on a forward-only engine (the reference model is frozen)")
        if loss_fn is not self._loss_fn:
            self._call("set_loss_fn", "the loss's set-up", loss_fn)
            self._loss_fn = loss_fn
        workers = self.verl_params.num_workers
        blocks = split_over_workers(with_normalisers(batch), workers)
        parts = self._call(
            "trinity_forward_backward",
            "forward/backward",
            blocks,
            [need_entropy] * workers,
            [out is not None] * workers,
        )
        if out is not None:
            rows = batch_rows(batch)  # padded rows (see pad_rows) come last: drop them
            out.update({k: torch.cat([p["outputs"][k] for p in parts])[:rows] for k in parts[0]["outputs"]})
        total = sum(loss / workers for part in parts for loss in part["losses"])  # undo the workers' dp scaling
        per_micro = [{k: v} for part in parts for k, values in part["metrics"].items() for v in values]
        stats = {k: sum(part["stats"].get(k, 0) for part in parts) for k in ("tokens", "grid")}  # what ran
        stats["rows"] = batch_rows(batch)  # the sequences trained: the copies that pad the workers' shares add none
        return {**mean_metrics(per_micro), **packing_metrics(stats), "loss": total}

    def optim_step(self, adam: AdamStep | None = None) -> dict[str, float]:
        """Clip, step AdamW (at ``adam``'s values when given, else the schedule's) and zero grads."""
        if self.params.forward_only:
            raise TrinityError("optim_step on a forward-only engine (the reference model is frozen)")
        return self._call("trinity_optim_step", "the optimiser step", adam)[0]

    def zero_grad(self) -> None:
        """Drop accumulated gradients without an optimiser step."""
        self._call("trinity_zero_grad", "zero_grad")

    def compute_logprobs(self, batch: Batch, *, need_entropy: bool = False) -> dict[str, torch.Tensor]:
        """``logprob [B, R]`` (and ``entropy``), or ``values``/``scores`` for value/reward models, no grad."""
        workers = self.verl_params.num_workers
        parts = self._call(
            "trinity_infer", "a forward pass", split_over_workers(batch, workers), [need_entropy] * workers
        )
        rows = batch_rows(batch)  # padded rows (see pad_rows) come last: drop them
        return {k: torch.cat([p[k] for p in parts])[:rows] for k in parts[0]}

    def state_dict(self) -> dict[str, torch.Tensor]:
        """Full weights gathered from the shards, on the driver's CPU."""
        return self._call("trinity_state_dict", "gathering the weights")[0]

    def export_weights(self, mailbox: WeightMailbox | None = None) -> SharedWeights:
        """The full weights in this engine's shared-memory mailbox, or in ``mailbox``
        (:mod:`~trinity_like.trainer.shared_weights`), written there by rank 0: a reader on
        this machine (the explorer actor) maps them without a trip through the driver or
        Ray's object store. Each export overwrites what that mailbox held. A tied output
        embedding is left out (the reader's model ties it)."""
        return self._call("trinity_export", "the weight export", (mailbox or self.mailbox).path)[0]

    def save(self, path: str) -> None:
        """The checkpoint layout of :mod:`~trinity_like.trainer.base`, written by rank 0."""
        self._call("trinity_save", "a checkpoint save", str(Path(path).resolve()), self.params.path)

    def load(self, path: str, *, with_optimizer: bool = True) -> None:
        """Weights (the adapter, with LoRA) and, with ``with_optimizer``, optimiser, step and RNG state."""
        folder = Path(path).resolve()
        lora_lib.check_checkpoint(folder, self.params.adapter)  # one clear error here, not a worker's traceback
        self._call("trinity_load", "a checkpoint load", str(folder), with_optimizer)

    def release_memory(self) -> None:
        """The workers hand back what their last step freed (they keep it for the next step
        otherwise: :mod:`trinity_like.malloc`)."""
        self._call("trinity_release_memory", "releasing memory")

    def resume_memory(self) -> None:
        """Nothing: the workers' next step takes back what :meth:`release_memory` returned."""

    def close(self) -> None:
        """Kill the workers, and Ray itself when this engine started it. On a Ray that stays up,
        return once Ray counts the workers' CPUs (GPUs) as free again, so that the next engine
        (the next stage, or a critic) finds them: freed bundles show up a moment after removal."""
        self.mailbox.close()
        resource = "GPU" if self.use_gpu else "CPU"
        free = ray.available_resources().get(resource, 0.0) + self.verl_params.num_workers
        for worker in self.group.workers:
            ray.kill(worker)
        for pg in self.pool.pgs or []:
            ray.util.remove_placement_group(pg)
        if self._started_ray:
            ray.shutdown()
            return
        deadline = time.monotonic() + 5.0  # others may take them meanwhile: never wait long
        while ray.available_resources().get(resource, 0.0) < free and time.monotonic() < deadline:
            time.sleep(0.05)
