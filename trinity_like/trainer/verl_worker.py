"""What runs inside each Ray worker of the ``verl`` engine: verl's FSDP training worker,
our loss adapter, and the conversions between our padded layout and verl's padding-free one.

The worker is verl 0.9.1's ``TinkerTrainingWorker`` (``TrainingWorker`` with split
forward/backward and optimiser steps, exactly our contract) plus a few methods the
driver needs: forward/backward and inference on our padded batches, the optimiser step
followed by the lr-scheduler step, gathering full weights, and HF-folder save/load.

Import order matters: in a worker started with ``VERL_PLATFORM=cpu``, ``verl_cpu.install()``
must run before any other verl module resolves its platform, so it is the first thing
this module does.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from trinity_like.trainer import verl_cpu

if verl_cpu.requested():
    verl_cpu.install()

import torch.distributed as dist  # noqa: E402
from safetensors.torch import load_file  # noqa: E402
from tensordict import TensorDict  # noqa: E402
from torch.distributed.checkpoint.state_dict import (  # noqa: E402
    StateDictOptions,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.tensor import DTensor  # noqa: E402
from verl.single_controller.base.decorator import Dispatch, register  # noqa: E402
from verl.utils import tensordict_utils as tu  # noqa: E402
from verl.workers.engine_workers_tinker import TinkerTrainingWorker  # noqa: E402
from verl.workers.utils.padding import left_right_2_no_padding, no_padding_2_padding  # noqa: E402

from trinity_like.errors import TrinityError  # noqa: E402
from trinity_like.trainer.base import LossCallable, conform_param_groups, row_unit  # noqa: E402
from trinity_like.trainer.params import AdamStep  # noqa: E402

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

OPTIMIZER_FILE = "optimizer.pt"  # full (unsharded) optimiser state keyed by parameter name, as the local engine
STATE_FILE = "trainer_state.json"  # {"step": optimiser steps taken}, which places the lr schedule
SCALARS_KEY = "trinity_scalars"  # the batch's 0-dim fields (JSON), carried as non-tensor data
KIND_KEY = "trinity_kind"  # ModelParams.kind: "lm", "value" or "reward"


def largest_divisor_at_most(n: int, cap: int, unit: int = 1) -> int:
    """The largest multiple d of ``unit`` with d <= cap (or d = unit) dividing n: verl's
    micro-batches must split a rank's rows exactly, and only between whole examples."""
    return max(d for d in range(unit, max(min(n, cap), unit) + 1, unit) if n % d == 0)


def to_verl(batch: Mapping[str, torch.Tensor], micro_batch_size: int, need_entropy: bool, kind: str) -> TensorDict:
    """Our padded batch -> verl's padding-free TensorDict (``left_right_2_no_padding``, as its trainer does).

    ``prompts``/``responses`` are added because verl's ``no_padding_2_padding`` reads the
    prompt and response lengths from them; 0-dim fields (the global normalisers) travel as
    non-tensor data, since a TensorDict is split along the batch dimension.
    """
    rows = batch["input_ids"].shape[0]
    response_len = batch["response_mask"].shape[1]
    tensors = {k: v for k, v in batch.items() if v.dim() > 0}
    tensors["prompts"] = batch["input_ids"][:, :-response_len]
    tensors["responses"] = batch["input_ids"][:, -response_len:]
    td = TensorDict(tensors, batch_size=[rows])
    td = left_right_2_no_padding(td)
    scalars = {k: float(v) for k, v in batch.items() if v.dim() == 0}
    tu.assign_non_tensor(
        td,
        temperature=1.0,
        calculate_entropy=need_entropy,
        use_dynamic_bsz=False,
        use_remove_padding=False,
        micro_batch_size_per_gpu=largest_divisor_at_most(rows, micro_batch_size, row_unit(batch)),
        **{SCALARS_KEY: json.dumps(scalars), KIND_KEY: kind},
    )
    return td


def from_verl(data: TensorDict) -> dict[str, torch.Tensor]:
    """One micro-batch of verl's TensorDict -> our padded batch (dense fields, normalisers)."""
    batch = {k: v for k, v in data.items() if isinstance(v, torch.Tensor) and not v.is_nested}
    for key, value in json.loads(tu.get_non_tensor_data(data, SCALARS_KEY, "{}")).items():
        batch[key] = torch.tensor(value)
    return batch


def last_token_values(values: torch.Tensor) -> torch.Tensor:
    """``scores [B]``: each sequence's value at its last token (padding-free nested layout)."""
    return values.values()[values.offsets()[1:] - 1]


def model_outputs_to_padded(model_output: Mapping[str, torch.Tensor], data: TensorDict) -> dict[str, torch.Tensor]:
    """verl's padding-free ``log_probs``/``entropy``/``values`` -> our ``[B, R]`` (or ``scores [B]``)."""
    if tu.get_non_tensor_data(data, KIND_KEY, "lm") == "reward":
        return {"scores": last_token_values(model_output["values"])}
    names = {"log_probs": "logprob", "entropy": "entropy", "values": "values"}
    return {ours: no_padding_2_padding(model_output[k], data) for k, ours in names.items() if k in model_output}


class VerlLossAdapter:
    """Wraps our ``(outputs, batch) -> (loss, metrics)`` as verl's ``(model_output, data, dp_group)``.

    Gradient scaling: our callable returns the micro-batch's share of the full-batch loss
    (it divides by the global ``num_tokens``/``num_seqs``). FSDP averages gradients over the
    ``dp_size`` data-parallel ranks, so the share is multiplied by ``dp_size``: the mean over
    ranks of ``dp_size * sum(shares on the rank)`` is the sum of all shares, the full-batch
    loss. (verl's own ``ppo_loss`` scales by ``dp_size`` for the same reason.)
    """

    def __init__(self, loss_fn: LossCallable) -> None:
        self.loss_fn = loss_fn

    def __call__(self, model_output: Mapping[str, torch.Tensor], data: TensorDict, dp_group: Any = None):
        loss, metrics = self.loss_fn(model_outputs_to_padded(model_output, data), from_verl(data))
        return loss * data["dp_size"], dict(metrics)


class TrinityVerlWorker(TinkerTrainingWorker):
    """verl's FSDP training worker, started on gloo when there is no GPU, with our entry points."""

    def __init__(self, config: Any, kind: str) -> None:
        from trinity_like.plugins import load_plugins

        self.kind = kind
        load_plugins()  # loss callables resolve registered components by name in this process
        if verl_cpu.requested() and not dist.is_initialized():
            # verl would start "cpu:gloo,cpu:gloo"; a plain gloo group is what FSDP2 needs here.
            rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
            dist.init_process_group(backend="gloo", rank=rank, world_size=world_size)
            # Workers on one CPU node share its cores: torch's default (all cores each)
            # oversubscribes them, so each worker takes its share.
            torch.set_num_threads(max(1, (os.cpu_count() or 1) // world_size))
        super().__init__(config)

    # -- training ------------------------------------------------------------------
    @register(dispatch_mode=Dispatch.DP_COMPUTE)
    def trinity_forward_backward(self, batch: dict[str, torch.Tensor], need_entropy: bool,
                                 keep_outputs: bool = False) -> dict[str, Any]:
        """Forward/backward over this rank's rows; grads accumulate until ``trinity_optim_step``.

        ``keep_outputs``: also return the padded model outputs the loss saw (``outputs``).
        """
        td = to_verl(batch, self.engine_config.micro_batch_size_per_gpu, need_entropy, self.kind)
        tu.assign_non_tensor(td, return_model_output=keep_outputs)
        with self.engine.train_mode(zero_grad_on_exit=False):
            out = self.engine.forward_backward_batch(td, loss_function=self.loss_fn, forward_only=False)
        result = {"losses": list(out["loss"]), "metrics": dict(out["metrics"])}
        if keep_outputs:
            padded = model_outputs_to_padded(out["model_output"], td)
            result["outputs"] = {k: v.detach().float().cpu() for k, v in padded.items()}
        return result

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def trinity_optim_step(self, adam: AdamStep | None = None) -> dict[str, float]:
        """Clip + AdamW step, then advance the scheduler; zeroes grads.

        The lr is the scheduler's unless ``adam`` sets this step's own hyper-parameters.
        """
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

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def trinity_zero_grad(self) -> None:
        """Drop accumulated gradients without stepping (a skipped, non-finite step)."""
        self.engine.optimizer.zero_grad(set_to_none=True)

    # -- inference -----------------------------------------------------------------
    @register(dispatch_mode=Dispatch.DP_COMPUTE)
    def trinity_infer(self, batch: dict[str, torch.Tensor], need_entropy: bool) -> dict[str, torch.Tensor]:
        """Forward only: our ``[B, R]`` outputs for this rank's rows."""
        td = to_verl(batch, self.engine_config.infer_micro_batch_size_per_gpu, need_entropy, self.kind)
        with self.engine.eval_mode():
            out = self.engine.infer_batch(td, loss_function=None)
        return {k: v.float().cpu() for k, v in model_outputs_to_padded(out["model_output"], td).items()}

    # -- weights and checkpoints ---------------------------------------------------
    def _full_state(self, keep: bool = True, skip_tied: bool = False) -> dict[str, torch.Tensor]:
        """Unsharded weights (a collective: every rank must call it); ``keep=False`` on the
        ranks that only take part in the gathers. ``skip_tied`` leaves out the output
        embedding when it is the input embedding (a reader re-ties it)."""
        tied = skip_tied and getattr(self.model_config.hf_config, "tie_word_embeddings", False)
        full = {}
        for name, param in self.engine.module.state_dict().items():
            if isinstance(param, DTensor):
                value = param.full_tensor().detach()  # a fresh tensor: no copy needed
            else:
                value = param.detach().cpu().clone() if keep else None
            if keep and not (tied and name == "lm_head.weight"):
                full[name] = value.cpu()
        return full

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def trinity_state_dict(self) -> dict[str, torch.Tensor] | None:
        """Full weights, returned by rank 0 only (the others return None to spare the transfer)."""
        full = self._full_state(keep=self.rank == 0)
        return full if self.rank == 0 else None

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def trinity_state_ref(self) -> list | None:
        """Rank 0 puts the full weights (tied output embedding left out) in Ray's object
        store and returns ``[ref]``: a reader fetches them straight from there, never
        through the driver. (Wrapped in a list so Ray hands back the reference itself.)"""
        import ray

        full = self._full_state(keep=self.rank == 0, skip_tied=True)
        return [ray.put(full)] if self.rank == 0 else None

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def trinity_save(self, path: str) -> None:
        """Rank 0 writes a Hugging Face folder, the full optimiser state and the step count."""
        full = self._full_state()
        optim = None
        if self.engine.optimizer is not None:
            options = StateDictOptions(full_state_dict=True, cpu_offload=True)
            optim = get_optimizer_state_dict(self.engine.module, self.engine.optimizer, options=options)
        if self.rank == 0:
            self._write_folder(Path(path), full, optim)
        dist.barrier()

    def _write_folder(self, out: Path, full: dict[str, torch.Tensor], optim: dict | None) -> None:
        from transformers import AutoModelForCausalLM, AutoModelForTokenClassification

        out.mkdir(parents=True, exist_ok=True)
        config = self.model_config.hf_config
        auto = AutoModelForCausalLM if self.config.model_type == "language_model" else AutoModelForTokenClassification
        with torch.device("meta"):
            model = auto.from_config(config)
        model.load_state_dict(full, assign=True, strict=True)
        model.save_pretrained(out, safe_serialization=True)
        self.model_config.tokenizer.save_pretrained(out)
        if optim is not None:
            torch.save(optim, out / OPTIMIZER_FILE)
        (out / STATE_FILE).write_text(json.dumps({"step": self.engine.lr_scheduler.last_epoch}))

    def _set_schedule_step(self, step: int) -> None:
        """Put verl's ``LambdaLR`` at optimiser step ``step``, and the lr with it."""
        scheduler = self.engine.lr_scheduler
        scheduler.last_epoch, scheduler._step_count = step, step + 1
        lrs = [base * fn(step) for base, fn in zip(scheduler.base_lrs, scheduler.lr_lambdas, strict=True)]
        for group, lr in zip(self.engine.optimizer.param_groups, lrs, strict=True):
            group["lr"] = lr
        scheduler._last_lr = lrs

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def trinity_load(self, path: str) -> None:
        """Every rank reads the folder written by ``trinity_save`` and keeps its own shard."""
        folder = Path(path)
        full = {}
        for file in sorted(folder.glob("*.safetensors")):
            full.update(load_file(str(file)))
        options = StateDictOptions(full_state_dict=True, strict=False)
        result = set_model_state_dict(self.engine.module, full, options=options)
        tied = {"lm_head.weight"} if getattr(self.model_config.hf_config, "tie_word_embeddings", False) else set()
        missing = set(result.missing_keys) - tied
        if missing or result.unexpected_keys:
            unexpected = sorted(result.unexpected_keys)
            raise TrinityError(f"checkpoint {path}: missing weights {sorted(missing)}, unexpected {unexpected}")
        if self.engine.optimizer is not None and (folder / OPTIMIZER_FILE).is_file():
            optim = conform_param_groups(torch.load(folder / OPTIMIZER_FILE, weights_only=True), self.engine.optimizer)
            set_optimizer_state_dict(
                self.engine.module, self.engine.optimizer, optim, options=StateDictOptions(full_state_dict=True)
            )
        if self.engine.lr_scheduler is not None and (folder / STATE_FILE).is_file():
            self._set_schedule_step(json.loads((folder / STATE_FILE).read_text())["step"])
        dist.barrier()
