"""The ``verl`` train engine: verl 0.9.1's FSDP training workers driven through Ray.

Workers are verl's engine-based ``TrainingWorker`` (see ``verl_worker.py``), created with
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

import os
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ray
import torch

from trinity_like import fault_points
from trinity_like.config.schema import ClusterConfig, Config
from trinity_like.config.schema import field_default as _default
from trinity_like.cpu_share import CoreShare
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
from trinity_like.trainer.verl_watch import gather

PLACEMENTS = {"pack": "STRICT_PACK", "spread": "STRICT_SPREAD"}  # cluster.placement -> Ray placement group strategy


@dataclass(frozen=True)
class VerlParams:
    """Where and how wide the verl workers run (``cluster`` of a recipe: :func:`verl_params`)."""

    num_workers: int = 1  # data-parallel FSDP ranks (one Ray actor each); a recipe's: cluster.workers
    ray_address: str | None = _default(ClusterConfig, "ray_address")  # an existing Ray cluster; None starts one here
    num_cpus: int | None = _default(ClusterConfig, "num_cpus")  # CPUs for a locally started Ray; None: Ray counts them
    use_gpu: bool = False  # one GPU per worker (nccl); False: CPU workers (gloo)
    placement: str = _default(ClusterConfig, "placement")  # "pack": every worker on one node; "spread": one node each
    strategy: str = "fsdp2"  # verl's FSDP flavour: "fsdp2" (fully_shard) or "fsdp"
    seed: int = _default(Config, "seed")  # verl's engine seed
    threads: int | None = None  # torch threads of each CPU worker; None: the node's cores // num_workers
    cores: CoreShare | None = None  # the board the CPU workers share the cores through with the explorer

    def __post_init__(self) -> None:
        if self.num_workers < 1:
            raise TrinityError(f"num_workers must be >= 1, got {self.num_workers}")
        if self.placement not in PLACEMENTS:
            raise TrinityError(f"placement {self.placement!r} unknown; expected one of {', '.join(PLACEMENTS)}")
        if self.strategy not in ("fsdp", "fsdp2"):
            raise TrinityError(f"verl strategy {self.strategy!r} unknown; expected fsdp2 or fsdp (fsdp2 on CPU)")


def verl_params(config: Config, cores: CoreShare | None = None) -> VerlParams:
    """A recipe's ``cluster`` section as verl worker placement (``cores``: :mod:`trinity_like.cpu_share`)."""
    c, threads = config.cluster, config.cpu_threads()
    return VerlParams(
        num_workers=c.workers,
        ray_address=c.ray_address,
        num_cpus=c.num_cpus,
        use_gpu=c.num_gpus > 0,
        placement=c.placement,
        seed=config.seed,
        threads=threads.trainer_alone if cores is not None else threads.trainer,
        cores=cores,
    )


def check_reachable(address: str, timeout_s: float = 5.0) -> None:
    """Fail fast on an unreachable ``host:port`` (``ray.init`` would retry GCS for minutes)."""
    if address == "auto":
        return  # Ray finds the local cluster itself and fails at once when there is none
    hostport = address.removeprefix("ray://").rsplit("/", 1)[0]
    host, _, port = hostport.rpartition(":")
    if not host or not port.isdigit():
        raise TrinityError(f"Ray address {address!r} is not of the form host:port or ray://host:port")
    try:
        socket.create_connection((host, int(port)), timeout=timeout_s).close()
    except OSError as exc:
        raise TrinityError(f"cannot reach the Ray cluster at {address!r}: {exc}") from exc


def start_ray(params: VerlParams) -> bool:
    """Connect to ``ray_address`` or start Ray here; True when this call started it."""
    if ray.is_initialized():
        return False
    if params.ray_address is not None:
        check_reachable(params.ray_address)
    env = ray_runtime_env()
    for attempt in range(3):
        try:
            if params.ray_address is None:
                ray.init(
                    address="local",
                    num_cpus=params.num_cpus,
                    include_dashboard=False,
                    runtime_env=env,
                    log_to_driver=False,
                )
            else:
                ray.init(address=params.ray_address, runtime_env=env, log_to_driver=False)
            return True
        except ConnectionError as exc:
            raise TrinityError(f"cannot reach the Ray cluster at {params.ray_address!r}: {exc}") from exc
        except Exception as exc:  # noqa: BLE001 -- only Ray's own start-up timeout is retried
            # Ray gives a starting raylet a fixed 30 s to register; on a loaded laptop it can
            # take longer. That one failure is retried; anything else propagates as it is.
            if "timed out during startup" not in str(exc) or attempt == 2 or params.ray_address is not None:
                raise
            ray.shutdown()
    return True


def check_model_folder(path: str) -> None:
    if not (Path(path) / "config.json").is_file():
        raise TrinityError(f"model folder {path!r} not found (no config.json there)")


def check_free_resources(workers: int, resource: str, placement: str = "pack") -> None:
    """Each worker's placement bundle takes one CPU (or GPU); Ray would wait forever for a
    placement group it cannot place, so one that does not fit now is an error instead of a
    hang: ``pack`` needs one node with a free unit per worker, ``spread`` ``workers`` nodes
    with one free unit each."""
    free = ray.available_resources().get(resource, 0.0)
    if free < workers:
        raise TrinityError(
            f"Ray has {free:g} free {resource} for {workers} verl workers (one each; actor, reference and "
            f"critic groups add up): start Ray with more logical CPUs (num_cpus) or use fewer workers"
        )
    # Ray has no public per-node view of free resources; its own `ray status` reads this one
    from ray._private.state import available_resources_per_node

    per_node = sorted((float(r.get(resource, 0.0)) for r in available_resources_per_node().values()), reverse=True)
    if placement == "pack" and per_node[0] < workers:
        raise TrinityError(
            f"cluster.placement: pack puts all {workers} verl workers on one node, but the most free {resource} "
            f"on one node is {per_node[0]:g} (free per node: {', '.join(f'{n:g}' for n in per_node)}): "
            f"set cluster.placement: spread to put them on several nodes, or use fewer workers"
        )
    if placement == "spread" and sum(n >= 1 for n in per_node) < workers:
        raise TrinityError(
            f"cluster.placement: spread puts each of the {workers} verl workers on a node of its own, but "
            f"{sum(n >= 1 for n in per_node)} of the cluster's {len(per_node)} nodes have a free {resource}: "
            f"add nodes, set cluster.placement: pack, or use fewer workers"
        )


def placement_group_for(workers: int, use_gpu: bool, placement: str) -> Any:
    """One placement group of ``workers`` bundles (a CPU each, and a GPU each on GPUs), packed on
    one node or spread over as many nodes: what verl's ``RayResourcePool`` would build for
    ``process_on_nodes=[workers]``, with the strategy it cannot be told."""
    from ray.util.placement_group import placement_group

    bundle = {"CPU": 1.0, **({"GPU": 1.0} if use_gpu else {})}
    pg = placement_group([dict(bundle) for _ in range(workers)], strategy=PLACEMENTS[placement])
    if not pg.wait(timeout_seconds=120):  # checked to fit before; a cluster that changed meanwhile
        ray.util.remove_placement_group(pg)
        raise TrinityError(f"Ray could not place {workers} verl workers ({PLACEMENTS[placement]}) within 120 s")
    return pg


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


def lora_target_modules(model: ModelParams) -> list[str]:
    """peft's ``target_modules`` for the adapter, found on a weightless (meta) copy of the model."""
    from transformers import AutoConfig, AutoModelForCausalLM

    with torch.device("meta"):
        meta = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(model.path))
    return lora_lib.target_modules(meta, model.adapter)


def worker_config(model: ModelParams, optim: OptimParams, verl: VerlParams, use_gpu: bool):
    """verl's ``TrainingWorkerConfig`` for our params: fp32 unless asked, no remove-padding, no compile."""
    from verl.trainer.config import CheckpointConfig
    from verl.workers.config import FSDPEngineConfig, FSDPOptimizerConfig, HFModelConfig, TrainingWorkerConfig

    # verl keeps fp32 master weights for training and computes in ``dtype`` (mixed precision);
    # a frozen model is stored in ``dtype`` itself.
    dtype = "fp32" if model.dtype == "float32" else "bf16"
    master = dtype if model.forward_only else "fp32"
    lora = model.adapter
    adapter = (
        {}
        if lora is None
        else {
            # verl wraps its model with peft's LoRA on these layers (_build_lora_module); the
            # workers then set our seeded initial adapter (trinity_init_adapter)
            "lora_rank": lora.rank,
            "lora_alpha": lora.alpha,
            "target_modules": lora_target_modules(model),
        }
    )
    model_config = HFModelConfig(
        path=model.path,
        override_config={"attn_implementation": model.attn_implementation},
        use_remove_padding=False,
        enable_gradient_checkpointing=model.gradient_checkpointing,
        **adapter,
    )
    engine_config = FSDPEngineConfig(
        strategy=verl.strategy,
        # verl's forward-only engines keep their weights in pinned CPU memory (an offload
        # policy for GPUs) and pinning needs an accelerator; on CPU a frozen model is a normal
        # engine that is never stepped (AdamW allocates no state before its first step).
        forward_only=model.forward_only and use_gpu,
        model_dtype=master,
        mixed_precision={"param_dtype": dtype, "reduce_dtype": "fp32", "buffer_dtype": "fp32"},
        use_dynamic_bsz=False,
        micro_batch_size_per_gpu=model.micro_batch_size,
        infer_micro_batch_size_per_gpu=model.micro_batch_size,
        use_torch_compile=False,
        use_remove_padding=False,
        seed=verl.seed,
        # Deferring the gradient reduce to the last micro-batch saves collectives between
        # ranks at the cost of a second, unsharded copy of every gradient held across the
        # micro-batches; one rank has nothing to save (0.5 GB for a 135M model).
        use_no_sync_for_gradient_accumulation=verl.num_workers > 1,
    )
    optim_config = FSDPOptimizerConfig(
        lr=optim.lr,
        betas=optim.betas,
        weight_decay=optim.weight_decay,
        clip_grad=optim.grad_clip if optim.grad_clip > 0 else float("inf"),  # 0: no clipping
        lr_warmup_steps=optim.warmup_steps,
        lr_scheduler_type=optim.scheduler,
        total_training_steps=optim.total_steps,
        min_lr_ratio=optim.min_lr_ratio,
        override_optimizer_config={"eps": optim.eps},
    )
    return TrainingWorkerConfig(
        model_type="language_model" if model.kind == "lm" else "value_model",
        model_config=model_config,
        engine_config=engine_config,
        optimizer_config=optim_config,
        checkpoint_config=CheckpointConfig(),
    )


class VerlEngine:
    """A :class:`~trinity_like.trainer.base.TrainEngine` over a group of verl FSDP workers."""

    def __init__(self, model: ModelParams, optim: OptimParams = OptimParams(), verl: VerlParams = VerlParams()) -> None:
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
        if os.environ.get(fault_points.ENV_VAR):  # a fault test's kill point inside a worker (verl_worker_update)
            worker_env[fault_points.ENV_VAR] = os.environ[fault_points.ENV_VAR]
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
        self.pids: list[int] = []
        self.pids = list(self._call("trinity_pid", "start-up"))  # the workers' processes (memory metrics, errors)
        if model.adapter is not None:
            self._call(
                "trinity_init_adapter", "start-up"
            )  # the local engine's seeded start, in place of verl's own draw
        self._loss_fn: LossCallable | None = None
        self.mailbox = WeightMailbox()  # export_weights writes here (rank 0 on the driver's machine)

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
        stats = {k: sum(part["stats"].get(k, 0) for part in parts) for k in ("tokens", "grid")}
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
