"""The ``local`` train engine: one process, plain torch, a Hugging Face model.

For prototyping, the client API and unit tests; it runs the same loss callables as the
``verl`` engine and steps to the same weights (``tests/trainer/test_verl_engine.py``).

The forward is :mod:`~trinity_like.trainer.forward`'s, the ``verl`` workers' too: each
distinct prompt of a micro-batch runs once with its responses packed after it, and the
LM head runs only on the positions that predict response tokens, in chunks.

Model kinds (:class:`~trinity_like.trainer.params.ModelParams` ``kind``):

- ``lm``: outputs ``logprob [B, R]`` (and ``entropy [B, R]``);
- ``value``: a critic, ``values [B, R]``, where the value of response token j is read at
  the position before it (verl's convention);
- ``reward``: a reward model, ``scores [B]``, read at each row's last non-pad token.

A value or reward model is a backbone plus ``Linear(hidden, 1)``: transformers'
``*ForTokenClassification`` with one label, the same architecture verl's critic engine
builds, so a critic folder moves between the engines and loads in ``transformers``
(``AutoModelForTokenClassification``). Started from a causal-LM folder, the head is new,
initialised from ``head_seed``.

Device and precision (:mod:`trinity_like.models.device`): the model lives on
``ModelParams.device`` (a recipe's ``cluster.device``; ``auto``: a GPU when torch sees one).
With ``dtype: auto`` its weights and AdamW state are float32 everywhere, and on CUDA and on a
CPU with bf16 units (AVX512-BF16, AMX) the forward and backward run under bf16 autocast;
logprobs, losses and the optimiser step stay float32 (``docs/precision.md``). Batches arrive on the CPU and are moved one micro-batch at a time; what comes back
(``compute_logprobs``, ``out``, :meth:`LocalEngine.state_dict`) is on the CPU, while
:meth:`LocalEngine.export_weights` hands out the live device tensors (an explorer on the same
GPU copies them device to device).

LoRA (``ModelParams(lora=LoraParams(rank=8))``, :mod:`~trinity_like.trainer.lora`): the
model is a ``peft`` LoRA model and the optimiser holds the adapter's parameters alone;
:meth:`LocalEngine.state_dict` merges the adapter into plain Hugging Face weights and
:meth:`LocalEngine.save` writes peft's adapter folder instead of the full model.

Example::

    engine = LocalEngine(ModelParams(path="tiny"), OptimParams(lr=1e-4))
    metrics = engine.forward_backward(batch, loss_fn)
    engine.optim_step()
    engine.save("ckpt/step_1")
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict, set_optimizer_state_dict
from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForTokenClassification, AutoTokenizer

from trinity_like import fault_points
from trinity_like.errors import TrinityError
from trinity_like.malloc import retain_freed_memory
from trinity_like.models.device import resolve_device, train_dtypes
from trinity_like.trainer import lora as lora_lib
from trinity_like.trainer.base import (
    Batch,
    LossCallable,
    mean_metrics,
    with_normalisers,
)
from trinity_like.trainer.checkpoint_files import (
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
from trinity_like.trainer.forward import model_outputs, packing_metrics, sorted_micro_batches
from trinity_like.trainer.params import AdamStep, ModelParams, OptimParams, lr_factor
from trinity_like.trainer.shared_weights import SharedWeights, WeightMailbox

# Optimiser state keyed by parameter name, unsharded: the format both engines write, so a
# checkpoint saved by one engine resumes on the other.
FULL = StateDictOptions(full_state_dict=True)


def load_model(path: str, params: ModelParams, device: torch.device | None = None) -> nn.Module:
    """Load the folder as a causal LM, or as a one-label token classifier for value/reward kinds,
    in the parameter dtype ``params.dtype`` gives on ``device`` (None: the CPU), onto ``device``.

    A missing folder is one clear error line. The classifier's dropout is off (as in verl's
    critic); a head missing from the folder is initialised under ``head_seed``.
    """
    if not (Path(path) / "config.json").is_file():
        raise TrinityError(f"model folder {path!r} not found (no config.json there)")
    device = device or torch.device("cpu")
    dtype, _ = train_dtypes(params.dtype, device)
    if params.kind == "lm":
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, attn_implementation=params.attn_implementation)
    else:
        config = AutoConfig.from_pretrained(path, num_labels=1)
        config.classifier_dropout = 0.0
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(params.head_seed)
            model = AutoModelForTokenClassification.from_pretrained(
                path, config=config, dtype=dtype, attn_implementation=params.attn_implementation
            )
    if params.gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return model.to(device)


class LocalEngine:
    """An in-process train engine implementing :class:`~trinity_like.trainer.base.TrainEngine`."""

    def __init__(self, model: ModelParams, optim: OptimParams = OptimParams()) -> None:
        retain_freed_memory()  # large tensors reuse freed pages (trinity_like/malloc.py)
        self.params = model
        self.optim_params = optim
        self.device = resolve_device(model.device)
        self.pids: list[int] = []  # no workers: the model lives in this process
        self.compute_dtype = train_dtypes(model.dtype, self.device)[1]  # bf16 autocast where precision() says
        self.model = load_model(model.path, model, self.device)
        if model.adapter is not None:
            self.model = lora_lib.apply_lora(self.model, model.adapter, base_path=model.path)
        self.tokenizer_path = model.path
        self.step = 0  # optimiser steps taken; drives the lr schedule
        self.optimizer = None if model.forward_only else self._build_optimizer()
        self.model.train(not model.forward_only)

    # -- construction --------------------------------------------------------------
    @property
    def architecture(self) -> str:
        return type(self.model).__name__

    @property
    def hf_model(self) -> nn.Module:
        """The transformers model itself (with peft's LoRA layers inside when an adapter trains)."""
        return self.model.get_base_model() if self.params.adapter is not None else self.model

    def _parameters(self) -> list[nn.Parameter]:
        """What the optimiser steps: every weight, or the adapter's alone with LoRA."""
        return [p for p in self.model.parameters() if p.requires_grad]

    def _build_optimizer(self) -> torch.optim.Optimizer:
        """AdamW, fused (one vectorised pass over each tensor) on the CPU and CUDA: torch's default
        for-loop AdamW took 0.46 CPU s per step for SmolLM2's 135 M weights on one core, fused 0.07
        -- a fifth of a bf16 update (``benchmarks/RESULTS.md``). Same update rule, same state."""
        o = self.optim_params
        return torch.optim.AdamW(
            self._parameters(),
            lr=o.lr,
            betas=o.betas,
            weight_decay=o.weight_decay,
            eps=o.eps,
            fused=self.device.type in ("cpu", "cuda"),
        )

    # -- forward -------------------------------------------------------------------
    def _forward(
        self, batch: Batch, need_entropy: bool, stats: dict[str, float] | None = None
    ) -> dict[str, torch.Tensor]:
        """What the model produces for the response columns of one micro-batch (:mod:`~trinity_like.trainer.forward`),
        run on the engine's device; callers run it inside :meth:`_compute_region`."""
        return model_outputs(
            self.hf_model,
            batch,
            self.params.kind,
            need_entropy=need_entropy,
            share_prompts=self.params.share_prompts,
            stats=stats,
        )

    def _compute_region(self) -> contextlib.AbstractContextManager:
        """bf16 autocast where :func:`~trinity_like.models.device.train_dtypes` says, around *every*
        micro-batch of a call: autocast keeps its bf16 copy of each fp32 weight until the outermost
        region ends, so the weights are cast once per call, not once per micro-batch (0.13 s of
        casts per micro-batch for SmolLM2 on one CPU core). Nothing else: a no-op context."""
        if self.compute_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=self.compute_dtype)

    def _exact(self) -> contextlib.AbstractContextManager:
        """Autocast off (inside :meth:`_compute_region`): the loss and its backward run in the
        dtypes the forward produced -- fp32 logprobs, bf16 where the forward ran bf16 -- as they
        would outside autocast. Leaving it this way keeps the region's weight cache alive."""
        if self.compute_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, enabled=False)

    def _on_device(self, batch: Batch) -> Batch:
        return {k: v.to(self.device, non_blocking=True) for k, v in batch.items()}

    # -- the contract --------------------------------------------------------------
    def forward_backward(
        self,
        batch: Batch,
        loss_fn: LossCallable,
        *,
        need_entropy: bool = False,
        out: dict[str, torch.Tensor] | None = None,
    ) -> dict[str, float]:
        """Accumulate the gradient of ``loss_fn`` over ``batch``, one micro-batch at a time.

        ``out``, when given, receives the model's outputs for every row (``logprob [B, R]``,
        ...), detached: what the loss saw, without a second forward pass.
        """
        if self.optimizer is None:
            raise TrinityError("forward_backward on a forward-only engine (the reference model is frozen)")
        self.model.train()
        batch = with_normalisers(batch)
        per_micro, total, kept, stats = [], 0.0, [], {}
        parts, restore = sorted_micro_batches(
            batch, self.params.micro_batch_size, share_prompts=self.params.share_prompts
        )
        with self._compute_region():
            for mb in parts:
                mb = self._on_device(mb)
                outputs = self._forward(mb, need_entropy, stats)
                with self._exact():
                    loss, metrics = loss_fn(outputs, mb)
                    loss.backward()
                total += float(loss.detach())
                per_micro.append(dict(metrics))
                if out is not None:
                    kept.append({k: v.detach().cpu() for k, v in outputs.items()})
        if out is not None:
            out.update({k: torch.cat([part[k] for part in kept])[restore] for k in kept[0]})
        return {**mean_metrics(per_micro), **packing_metrics(stats), "loss": total}

    def optim_step(self, adam: AdamStep | None = None) -> dict[str, float]:
        """Clip, step AdamW, zero grads. A non-finite grad norm skips the step.

        The lr is the schedule's unless ``adam`` gives this step's own hyper-parameters.
        """
        if self.optimizer is None:
            raise TrinityError("optim_step on a forward-only engine (the reference model is frozen)")
        if adam is None:
            lr, grad_clip = self.optim_params.lr * lr_factor(self.step, self.optim_params), self.optim_params.grad_clip
            for group in self.optimizer.param_groups:
                group["lr"] = lr
        else:
            lr, grad_clip = adam.lr, adam.grad_clip
            adam.apply(self.optimizer)
        clip = grad_clip if grad_clip > 0 else float("inf")  # 0: no clipping
        grad_norm = torch.nn.utils.clip_grad_norm_(self._parameters(), max_norm=clip)
        if torch.isfinite(grad_norm):
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.step += 1
        return {"grad_norm": float(grad_norm), "lr": lr}

    @torch.no_grad()
    def zero_grad(self) -> None:
        """Drop accumulated gradients without an optimiser step (a skipped, non-finite step)."""
        if self.optimizer is not None:
            self.optimizer.zero_grad(set_to_none=True)

    @torch.no_grad()
    def compute_logprobs(self, batch: Batch, *, need_entropy: bool = False) -> dict[str, torch.Tensor]:
        """The model's outputs for the response columns (``logprob``, or ``values``/``scores``), no grad.

        Whatever this returns is a constant to the losses (old logprobs, old values): a graph
        here would leak their gradient into the update.
        """
        was_training = self.model.training
        self.model.eval()
        parts, restore = sorted_micro_batches(
            batch, self.params.micro_batch_size, share_prompts=self.params.share_prompts
        )
        with self._compute_region():
            outputs = [
                {k: v.cpu() for k, v in self._forward(self._on_device(mb), need_entropy).items()} for mb in parts
            ]
        self.model.train(was_training)
        return {k: torch.cat([o[k] for o in outputs])[restore] for k in outputs[0]}

    def state_dict(self) -> dict[str, torch.Tensor]:
        """Full weights on CPU under the base model's Hugging Face names; with LoRA, merged
        (``W + (alpha / rank) B A``, see :mod:`~trinity_like.trainer.lora`), the model untouched."""
        state = {k: v.detach().cpu().clone() for k, v in self.model.state_dict().items()}
        lora = self.params.adapter
        return state if lora is None else lora_lib.merged_state_dict(state, lora)

    def release_memory(self) -> None:
        """On a GPU, hand the memory the last step freed (activations; gradients are dropped by
        every optimiser step) back to the device, for an explorer that samples next on the same
        card. On the CPU nothing: an explorer in this process reuses it page for page."""
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    def resume_memory(self) -> None:
        """Nothing ahead of time: the next step allocates what it needs."""

    def export_weights(self, mailbox: WeightMailbox | None = None) -> dict[str, torch.Tensor] | SharedWeights:
        """The weights for an explorer: views of the live weights where they are -- on the
        engine's device (an explorer on the same GPU copies them device to device; no snapshot of
        0.5 GB is made for SmolLM2) -- merged with LoRA there; written into ``mailbox`` when one
        is given (a shared-memory file: through the host)."""
        live = {k: v.detach() for k, v in self.model.state_dict().items()}
        lora = self.params.adapter
        weights = live if lora is None else lora_lib.merged_state_dict(live, lora)
        return weights if mailbox is None else mailbox.write(weights)

    def save(self, path: str) -> None:
        """A checkpoint folder (layout in :mod:`~trinity_like.trainer.base`): the Hugging Face
        folder, or peft's adapter folder with LoRA, plus optimiser, step and RNG state."""
        out = Path(path)
        out.mkdir(parents=True, exist_ok=True)
        lora = self.params.adapter
        if lora is None:
            self.model.save_pretrained(out, safe_serialization=True)
            if (Path(self.tokenizer_path) / "tokenizer_config.json").is_file():
                AutoTokenizer.from_pretrained(self.tokenizer_path).save_pretrained(out)
        else:
            _, adapter = lora_lib.split_state({k: v for k, v in self.model.state_dict().items() if ".lora_" in k})
            lora_lib.write_adapter(out, adapter, self.model.peft_config[lora_lib.ADAPTER_NAME])
        lora_lib.write_base_note(out, self.params.path, lora)
        fault_points.reach("after_weights")
        if self.optimizer is not None:
            save_optimizer_state(
                get_optimizer_state_dict(self.model, self.optimizer, options=FULL), out / OPTIMIZER_FILE
            )
        fault_points.reach("after_optimizer")
        save_file(rng_state(), str(out / RNG_FILE))
        write_trainer_state(out, self.step)

    def load(self, path: str, *, with_optimizer: bool = True) -> None:
        """Restore what :meth:`save` wrote: the weights (the adapter, with LoRA), and with
        ``with_optimizer`` the optimiser state, step count and RNG state; without it the
        optimiser starts fresh at step 0."""
        folder = Path(path)
        lora_lib.check_checkpoint(folder, self.params.adapter)
        if self.params.adapter is not None:
            adapter = lora_lib.adapter_to_peft_state(lora_lib.read_adapter(folder))
            copy_adapter(self.model, adapter, str(folder))
        else:
            self.model = load_model(path, self.params, self.device)
            self.tokenizer_path = path
        self.step = 0
        if self.optimizer is not None:
            self.optimizer = self._build_optimizer()
        if with_optimizer:
            check_no_legacy_optimizer(folder)
            self.step = read_trainer_state(folder)
            if self.optimizer is not None and (folder / OPTIMIZER_FILE).is_file():
                state = load_optimizer_state(folder / OPTIMIZER_FILE)
                if state["state"]:  # a checkpoint before the first step holds no moments: fresh is the same
                    state = conform_param_groups(state, self.optimizer, self.model)
                    set_optimizer_state_dict(self.model, self.optimizer, state, options=FULL)
            if (folder / RNG_FILE).is_file():
                set_rng_state(load_file(str(folder / RNG_FILE)))
        self.model.train(not self.params.forward_only)

    def close(self) -> None:
        """Drop the model and optimiser so their memory can be freed."""
        self.model = None
        self.optimizer = None


def copy_adapter(model: nn.Module, adapter: dict[str, torch.Tensor], where: str) -> None:
    """Copy ``adapter`` (peft parameter names) into ``model``'s LoRA parameters; they must match exactly."""
    own = {k: v for k, v in model.named_parameters() if ".lora_" in k}
    missing, unexpected = sorted(set(own) - set(adapter)), sorted(set(adapter) - set(own))
    wrong = sorted(k for k in set(own) & set(adapter) if own[k].shape != adapter[k].shape)
    if missing or unexpected or wrong:
        raise TrinityError(
            f"{where}: the adapter does not fit this model (missing {missing[:3]}, unexpected "
            f"{unexpected[:3]}, other shapes {wrong[:3]})"
        )
    with torch.no_grad():
        for name, param in own.items():
            param.copy_(adapter[name])
