"""What runs inside each Ray worker of the ``verl`` engine: verl's FSDP training worker with
our model forward.

The worker is verl 0.9.1's ``TinkerTrainingWorker`` (``TrainingWorker`` with split
forward/backward and optimiser steps, exactly our contract) plus a few methods the
driver needs: forward/backward and inference on our padded batches, the optimiser step
followed by the lr-scheduler step, gathering full weights, and checkpoint save/load.

verl builds, shards (FSDP2), steps and checkpoints the model; the forward is ours
(:mod:`~trinity_like.trainer.forward`, the local engine's): each group's prompt once, the
head only on response positions. It runs as the FSDP root module's forward
(:func:`~trinity_like.trainer.forward.as_forward`), so FSDP's unshard, reshard and
gradient reduction wrap it exactly as they wrap verl's own forward step.

LoRA: verl wraps its model in peft's LoRA (``HFModelConfig.lora_rank``, built in
``FSDPEngine._build_lora_module``); the worker then sets our seeded initial adapter,
merges the adapter into plain full weights for weight sync (:mod:`~trinity_like.trainer.lora`)
and saves and loads peft's adapter folder, the frozen base staying as verl loaded it.

Import order matters: in a worker started with ``VERL_PLATFORM=cpu``, ``verl_cpu.install()``
must run before any other verl module resolves its platform, so it is the first thing
this module does.
"""

from __future__ import annotations

import os
from contextlib import nullcontext
from functools import partial
from pathlib import Path
from typing import Any

import torch

from trinity_like.trainer import verl_cpu

if verl_cpu.requested():
    verl_cpu.install()

import torch.distributed as dist  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402
from torch.distributed.checkpoint.state_dict import (  # noqa: E402
    StateDictOptions,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.tensor import DTensor  # noqa: E402
from verl.single_controller.base.decorator import Dispatch, register  # noqa: E402
from verl.workers.engine_workers_tinker import TinkerTrainingWorker  # noqa: E402

from trinity_like import fault_points  # noqa: E402
from trinity_like.cpu_share import TRAINER, CoreShare  # noqa: E402
from trinity_like.errors import TrinityError  # noqa: E402
from trinity_like.malloc import release_freed_memory, retain_freed_memory  # noqa: E402
from trinity_like.trainer import lora as lora_lib  # noqa: E402
from trinity_like.trainer.base import LossCallable  # noqa: E402
from trinity_like.trainer.checkpoint_files import (  # noqa: E402
    OPTIMIZER_FILE,
    RNG_FILE,
    check_no_legacy_optimizer,
    conform_param_groups,
    load_optimizer_state,
    read_trainer_state,
    rng_state,
    save_optimizer_state,
    set_rng_state,
    write_trainer_state,
)
from trinity_like.trainer.forward import as_forward, model_outputs, sorted_micro_batches  # noqa: E402
from trinity_like.trainer.lora import LoraParams  # noqa: E402
from trinity_like.trainer.params import AdamStep  # noqa: E402
from trinity_like.trainer.shared_weights import SharedWeights, write_into  # noqa: E402


def skip_verl_trl_patch_without_value_head() -> None:
    """Stop verl's model patching from importing a class that recent ``trl`` no longer has.

    verl 0.9.1's ``apply_monkey_patch`` (run on every model it builds) imports
    ``AutoModelForCausalLMWithValueHead`` whenever ``trl`` is importable, to patch its
    ``state_dict``; trl 1.x has no such class (neither at top level nor in
    ``trl.experimental.ppo``), so with trl installed (our ``bench`` extra) every worker
    failed to build its model. Our critics are ``*ForTokenClassification``, never trl
    value-head models, so that step is skipped when the class is missing.
    """
    import verl.models.transformers.monkey_patch as verl_patch

    if not verl_patch.is_trl_available():
        return
    try:
        from trl import AutoModelForCausalLMWithValueHead  # noqa: F401
    except ImportError:
        try:
            from trl.experimental.ppo import AutoModelForCausalLMWithValueHead  # noqa: F401
        except ImportError:
            verl_patch.is_trl_available = lambda: False


skip_verl_trl_patch_without_value_head()

MODEL_WEIGHTS = "model*.safetensors"  # a Hugging Face folder's weight files (one, or shards)


class TrinityVerlWorker(TinkerTrainingWorker):
    """verl's FSDP training worker, started on gloo when there is no GPU, with our entry points."""

    def __init__(
        self,
        config: Any,
        kind: str,
        lora: LoraParams | None = None,
        share_prompts: bool = True,
        num_threads: int | None = None,
        cores: CoreShare | None = None,
    ) -> None:
        from trinity_like.plugins import load_plugins

        self.kind = kind
        self.lora = lora  # the adapter verl's peft model trains (config.model_config's lora_rank > 0), else None
        self.share_prompts = share_prompts  # each distinct prompt once per micro-batch (trainer/forward.py)
        self.cores = cores  # shared with the explorer: the threads to take before each micro-batch (cpu_share.py)
        load_plugins()  # loss callables resolve registered components by name in this process
        if verl_cpu.requested() and not dist.is_initialized():
            # verl would start "cpu:gloo,cpu:gloo"; a plain gloo group is what FSDP2 needs here.
            rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
            dist.init_process_group(backend="gloo", rank=rank, world_size=world_size)
            # Workers on one CPU node share its cores: torch's default (all cores each)
            # oversubscribes them, so each worker takes its share (or what the driver says).
            torch.set_num_threads(num_threads or max(1, (os.cpu_count() or 1) // world_size))
            retain_freed_memory()  # large tensors reuse freed pages (trinity_like/malloc.py)
        super().__init__(config)

    # -- training ------------------------------------------------------------------
    @register(dispatch_mode=Dispatch.ONE_TO_ALL, blocking=False)
    def set_loss_fn(self, loss_fn: LossCallable) -> None:
        """The loss callable (:mod:`~trinity_like.trainer.base`) the next forward/backward calls run."""
        self.loss_fn = loss_fn

    def _run(
        self, batch: dict[str, torch.Tensor], need_entropy: bool, *, train: bool, keep_outputs: bool
    ) -> dict[str, Any]:
        """Our forward (:mod:`~trinity_like.trainer.forward`) over this rank's rows, micro-batch
        by micro-batch, run as the FSDP root module's forward so that FSDP unshards, reshards
        and reduces gradients around it as around verl's own; with ``train``, each
        micro-batch's loss is backpropagated (gradients synchronised after the last one).

        Gradient scaling: the loss callable returns the micro-batch's share of the full-batch
        loss (it divides by the global ``num_tokens``/``num_seqs``) and FSDP averages gradients
        over the ``dp`` ranks, so the share is multiplied by ``dp``: the mean over ranks of
        ``dp * sum(shares on the rank)`` is the full-batch loss (verl's ``ppo_loss`` does the same).
        """
        engine, root = self.engine, self.engine.module
        model = root.get_base_model() if self.lora is not None else root  # the transformers model
        device = next(root.parameters()).device
        dtype = getattr(engine, "_autocast_dtype", torch.float32)  # verl's mixed-precision compute dtype
        autocast = nullcontext() if dtype == torch.float32 else torch.autocast(device_type=device.type, dtype=dtype)
        parts, restore = sorted_micro_batches(
            batch, self.engine_config.micro_batch_size_per_gpu, share_prompts=self.share_prompts
        )
        dp, stats, losses, metrics, kept = dist.get_world_size(), {}, [], {}, []
        for i, mb in enumerate(parts):
            if self.cores is not None:
                self.cores.fit(TRAINER)
            mb = {k: v.to(device) for k, v in mb.items()}
            last = i == len(parts) - 1
            sync = engine._gradient_sync_context(is_last_micro_batch=last) if train else nullcontext()
            with (
                sync,
                autocast,
                as_forward(
                    root,
                    partial(
                        model_outputs,
                        model,
                        mb,
                        self.kind,
                        need_entropy=need_entropy,
                        share_prompts=self.share_prompts,
                        stats=stats,
                    ),
                ),
            ):
                outputs = root()
                if train:
                    loss, mb_metrics = self.loss_fn(outputs, mb)
                    if i == 0 and dist.get_rank() == dp - 1:  # the last rank, between its forward and backward
                        fault_points.reach("verl_worker_update")
                    if (
                        self.cores is not None
                    ):  # backward is ~2/3 of a micro-batch: widen here too when the explorer is done
                        self.cores.fit(TRAINER)
                    (loss * dp).backward()
                    losses.append(float(loss.detach()) * dp)
                    for k, v in mb_metrics.items():
                        metrics.setdefault(k, []).append(v)
            if keep_outputs:
                kept.append({k: v.detach().float().cpu() for k, v in outputs.items()})
        result = {"losses": losses, "metrics": metrics, "stats": stats}
        if keep_outputs:
            result["outputs"] = {k: torch.cat([part[k] for part in kept])[restore] for k in kept[0]}
        return result

    @register(dispatch_mode=Dispatch.DP_COMPUTE, blocking=False)
    def trinity_forward_backward(
        self, batch: dict[str, torch.Tensor], need_entropy: bool, keep_outputs: bool = False
    ) -> dict[str, Any]:
        """Forward/backward over this rank's rows; grads accumulate until ``trinity_optim_step``.

        Returns each micro-batch's loss and metrics, the packing ``stats`` and, with
        ``keep_outputs``, the outputs the loss saw (``outputs``, ``[rows, R]`` each).
        """
        with self.engine.train_mode(zero_grad_on_exit=False):
            return self._run(batch, need_entropy, train=True, keep_outputs=keep_outputs)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL, blocking=False)
    def trinity_optim_step(self, adam: AdamStep | None = None) -> dict[str, float]:
        """Clip + AdamW step, then advance the scheduler; zeroes grads.

        The lr is the scheduler's unless ``adam`` sets this step's own hyper-parameters.
        """
        if self.cores is not None:
            self.cores.fit(TRAINER)
        with self.engine.train_mode(zero_grad_on_exit=True):
            clip = self.engine.optimizer_config.clip_grad
            if adam is not None:
                adam.apply(self.engine.optimizer)
                self.engine.optimizer_config.clip_grad = adam.grad_clip if adam.grad_clip > 0 else float("inf")
            lr = self.engine.optimizer.param_groups[0]["lr"]
            try:
                grad_norm = self.engine.optimizer_step()
            finally:
                self.engine.optimizer_config.clip_grad = clip
            self.engine.lr_scheduler_step()
        return {"grad_norm": float(grad_norm), "lr": float(lr)}

    @register(dispatch_mode=Dispatch.ONE_TO_ALL, blocking=False)
    def trinity_pid(self) -> int:
        """This worker's process id (the driver reads its resident memory)."""
        return os.getpid()

    @register(dispatch_mode=Dispatch.ONE_TO_ALL, blocking=False)
    def trinity_threads(self) -> int:
        """This worker's torch threads (VerlParams.threads, or its share of the node's cores)."""
        return torch.get_num_threads()

    @register(dispatch_mode=Dispatch.ONE_TO_ALL, blocking=False)
    def trinity_release_memory(self) -> None:
        """Hand the memory freed since the last step back to the kernel (:mod:`trinity_like.malloc`)."""
        release_freed_memory()

    @register(dispatch_mode=Dispatch.ONE_TO_ALL, blocking=False)
    def trinity_zero_grad(self) -> None:
        """Drop accumulated gradients without stepping (a skipped, non-finite step)."""
        self.engine.optimizer.zero_grad(set_to_none=True)

    # -- inference -----------------------------------------------------------------
    @register(dispatch_mode=Dispatch.DP_COMPUTE, blocking=False)
    def trinity_infer(self, batch: dict[str, torch.Tensor], need_entropy: bool) -> dict[str, torch.Tensor]:
        """Forward only: our ``[B, R]`` outputs (``scores [B]`` for a reward model) for this rank's rows."""
        with self.engine.eval_mode(), torch.no_grad():
            return self._run(batch, need_entropy, train=False, keep_outputs=True)["outputs"]

    # -- weights and checkpoints ---------------------------------------------------
    @register(dispatch_mode=Dispatch.ONE_TO_ALL, blocking=False)
    def trinity_init_adapter(self) -> None:
        """Put the adapter at our seeded start (:func:`~trinity_like.trainer.lora.initial_adapter`),
        in place of the one verl's peft drew from its own RNG: the same start as the local engine."""
        shapes = {name: value.shape for name, value in self.engine.module.state_dict().items() if ".lora_" in name}
        full = lora_lib.initial_adapter_from_shapes(shapes, self.lora)
        set_model_state_dict(self.engine.module, full, options=StateDictOptions(full_state_dict=True, strict=False))

    def _gathered_state(self, keep: bool = True) -> dict[str, torch.Tensor]:
        """The module's unsharded state dict as it names it (peft's names with LoRA); a
        collective: every rank calls it, ``keep=False`` on the ranks that only take part."""
        full = {}
        for name, param in self.engine.module.state_dict().items():
            if isinstance(param, DTensor) and param.device_mesh.size() == 1 and param.to_local().shape == param.shape:
                value = param.to_local().detach()  # one rank holds it all: the shard itself, no copy
            elif isinstance(param, DTensor):
                value = param.full_tensor().detach()  # a fresh tensor: no copy needed
            else:
                value = param.detach().cpu().clone() if keep else None
            if keep:
                full[name] = value.cpu()
        return full

    def _full_state(self, keep: bool = True, skip_tied: bool = False) -> dict[str, torch.Tensor]:
        """Full weights under plain Hugging Face names, an adapter merged into them (a
        collective, as :meth:`_gathered_state`). ``skip_tied`` leaves out the output embedding
        when it is the input embedding (a reader re-ties it) -- never when a trained adapter
        on it parts the two (:func:`~trinity_like.trainer.lora.unties_embeddings`)."""
        config = self.model_config.hf_config
        tied = (
            skip_tied
            and getattr(config, "tie_word_embeddings", False)
            and not lora_lib.unties_embeddings(self.lora, config)
        )
        full = self._gathered_state(keep)
        if keep and self.lora is not None:
            full = lora_lib.merged_state_dict(full, self.lora)
        if tied:
            full.pop("lm_head.weight", None)
        return full

    @register(dispatch_mode=Dispatch.ONE_TO_ALL, blocking=False)
    def trinity_state_dict(self) -> dict[str, torch.Tensor] | None:
        """Full weights, returned by rank 0 only (the others return None to spare the transfer)."""
        full = self._full_state(keep=self.rank == 0)
        return full if self.rank == 0 else None

    @register(dispatch_mode=Dispatch.ONE_TO_ALL, blocking=False)
    def trinity_export(self, path: str) -> SharedWeights | None:
        """Rank 0 writes the full weights (tied output embedding left out) into the mailbox
        file ``path`` (:mod:`~trinity_like.trainer.shared_weights`) and returns its handle:
        a reader on this machine maps them from there, never through the driver."""
        full = self._full_state(keep=self.rank == 0, skip_tied=True)
        return write_into(path, full.items()) if self.rank == 0 else None

    def _trainable_names(self) -> set[str]:
        return {name for name, p in self.engine.module.named_parameters() if p.requires_grad}

    @register(dispatch_mode=Dispatch.ONE_TO_ALL, blocking=False)
    def trinity_save(self, path: str, base_model: str) -> None:
        """Rank 0 writes the checkpoint folder (layout in :mod:`~trinity_like.trainer.base`):
        a Hugging Face folder or peft's adapter folder, the full optimiser state, the step
        count and every rank's RNG state."""
        raw = self._gathered_state(keep=self.rank == 0)
        optim = None
        if self.engine.optimizer is not None:
            options = StateDictOptions(full_state_dict=True, cpu_offload=True)
            optim = get_optimizer_state_dict(self.engine.module, self.engine.optimizer, options=options)
            trainable = self._trainable_names()  # verl's AdamW also holds the frozen base: leave it out
            for group in optim.get("param_groups", []):  # (only rank 0 holds the gathered state)
                group["params"] = [name for name in group["params"] if name in trainable]
        rngs = [None] * dist.get_world_size()
        dist.all_gather_object(rngs, rng_state())
        if self.rank == 0:
            out = Path(path)
            out.mkdir(parents=True, exist_ok=True)
            if self.lora is None:
                self._write_folder(out, raw)
            else:
                _, adapter = lora_lib.split_state({k: v for k, v in raw.items() if ".lora_" in k})
                config = self.engine.module.peft_config[lora_lib.ADAPTER_NAME]
                lora_lib.write_adapter(out, adapter, config)
            lora_lib.write_base_note(out, base_model, self.lora)
            if optim is not None:
                save_optimizer_state(optim, out / OPTIMIZER_FILE)
            save_file(rng_files(rngs), str(out / RNG_FILE))
            write_trainer_state(out, self.engine.lr_scheduler.last_epoch if self.engine.lr_scheduler else 0)
        dist.barrier()

    def _write_folder(self, out: Path, full: dict[str, torch.Tensor]) -> None:
        from transformers import AutoModelForCausalLM, AutoModelForTokenClassification

        config = self.model_config.hf_config
        auto = AutoModelForCausalLM if self.config.model_type == "language_model" else AutoModelForTokenClassification
        with torch.device("meta"):
            model = auto.from_config(config)
        model.load_state_dict(full, assign=True, strict=True)
        model.save_pretrained(out, safe_serialization=True)
        self.model_config.tokenizer.save_pretrained(out)

    def _set_schedule_step(self, step: int) -> None:
        """Put verl's ``LambdaLR`` at optimiser step ``step``, and the lr with it."""
        scheduler = self.engine.lr_scheduler
        scheduler.last_epoch, scheduler._step_count = step, step + 1
        lrs = [base * fn(step) for base, fn in zip(scheduler.base_lrs, scheduler.lr_lambdas, strict=True)]
        for group, lr in zip(self.engine.optimizer.param_groups, lrs, strict=True):
            group["lr"] = lr
        scheduler._last_lr = lrs

    def _load_weights(self, folder: Path) -> None:
        """The checkpoint's weights into the shards: the full model, or the adapter with LoRA."""
        lora_lib.check_checkpoint(folder, self.lora)  # the driver checked it too (a clearer error there)
        if self.lora is not None:
            full = lora_lib.adapter_to_peft_state(lora_lib.read_adapter(folder))
            own = {name for name in self.engine.module.state_dict() if ".lora_" in name}
            if set(full) != own:
                raise TrinityError(
                    f"{folder}: the adapter does not fit this model (missing "
                    f"{sorted(own - set(full))[:3]}, unexpected {sorted(set(full) - own)[:3]})"
                )
            set_model_state_dict(self.engine.module, full, options=StateDictOptions(full_state_dict=True, strict=False))
            return
        full = {}
        for file in sorted(folder.glob(MODEL_WEIGHTS)):
            full.update(load_file(str(file)))
        options = StateDictOptions(full_state_dict=True, strict=False)
        result = set_model_state_dict(self.engine.module, full, options=options)
        tied = {"lm_head.weight"} if getattr(self.model_config.hf_config, "tie_word_embeddings", False) else set()
        missing = set(result.missing_keys) - tied
        if missing or result.unexpected_keys:
            unexpected = sorted(result.unexpected_keys)
            raise TrinityError(f"checkpoint {folder}: missing weights {sorted(missing)}, unexpected {unexpected}")

    @register(dispatch_mode=Dispatch.ONE_TO_ALL, blocking=False)
    def trinity_load(self, path: str, with_optimizer: bool = True) -> None:
        """Every rank reads the folder written by ``trinity_save`` and keeps its own shard;
        without ``with_optimizer`` the optimiser restarts (no moments, schedule at step 0)."""
        folder = Path(path)
        self._load_weights(folder)
        optimizer, scheduler = self.engine.optimizer, self.engine.lr_scheduler
        if optimizer is not None:
            optimizer.state.clear()
        if scheduler is not None:
            self._set_schedule_step(0)
        if with_optimizer:
            check_no_legacy_optimizer(folder)
            if optimizer is not None and (folder / OPTIMIZER_FILE).is_file():
                optim = load_optimizer_state(folder / OPTIMIZER_FILE)
                if optim["state"]:  # a checkpoint before the first step holds no moments: fresh is the same
                    optim = conform_param_groups(optim, optimizer, self.engine.module)
                    set_optimizer_state_dict(
                        self.engine.module, optimizer, optim, options=StateDictOptions(full_state_dict=True)
                    )
            if scheduler is not None:
                self._set_schedule_step(read_trainer_state(folder))
            if (folder / RNG_FILE).is_file():
                set_rng_state(rank_rng(load_file(str(folder / RNG_FILE)), self.rank))
        dist.barrier()


def rng_files(per_rank: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Every rank's RNG state in one file: rank 0's under its plain keys (``cpu``, as the local
    engine writes), rank r's under ``rank<r>.<key>``."""
    out = dict(per_rank[0])
    for rank, state in enumerate(per_rank[1:], start=1):
        out.update({f"rank{rank}.{k}": v for k, v in state.items()})
    return out


def rank_rng(saved: dict[str, torch.Tensor], rank: int) -> dict[str, torch.Tensor]:
    """This rank's RNG state from :func:`rng_files` (a file with one state gives it to every rank)."""
    prefix = f"rank{rank}."
    own = {k.removeprefix(prefix): v for k, v in saved.items() if k.startswith(prefix)}
    return own or {k: v for k, v in saved.items() if not k.startswith("rank")}
