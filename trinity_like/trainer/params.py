"""Typed parameters shared by every train engine, and the learning-rate schedule.

Both engines read the same :class:`ModelParams` and :class:`OptimParams`, so a recipe
switches engines without touching its optimiser settings. A value has one default, here:
the recipe schema's matching fields take theirs from these classes
(``param_default`` in :mod:`trinity_like.config.schema`), and :mod:`trinity_like.config.engine_params` builds them from a
recipe -- the trainer never reads the recipe itself. The schedule below is the
one verl's FSDP engine applies (``verl.utils.torch_functional``'s warmup + constant /
cosine ``LambdaLR``; the test compares the two), so both engines step with the same
learning rate at every step.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Literal, get_args

from trinity_like.cpu_share import CoreShare
from trinity_like.errors import TrinityError

DEFAULT_SEED = 42  # a recipe's default ``seed`` (the schema takes it from here): LoRA's and a new head's start


@dataclass(frozen=True)
class LoraParams:
    """Which layers get a LoRA adapter, its rank, scale and initial seed."""

    rank: int = 0  # adapter rank r; 0: no adapter, every weight trains
    alpha: float = 32.0  # scale numerator: the update is (alpha / rank) * B A
    train_attn: bool = True  # adapters on the attention projections
    train_mlp: bool = True  # adapters on the MLP projections
    train_unembed: bool = True  # an adapter on the output layer
    seed: int = DEFAULT_SEED  # seeds A's initialisation (B starts at 0)

    def __post_init__(self) -> None:
        if self.rank < 0:
            raise TrinityError(f"LoRA rank must be >= 0 (0: train every weight), got {self.rank}")
        if self.alpha <= 0:
            raise TrinityError(f"LoRA alpha must be > 0, got {self.alpha}")
        if self.rank > 0 and not (self.train_attn or self.train_mlp or self.train_unembed):
            raise TrinityError("LoRA with train_attn, train_mlp and train_unembed all off has nothing to train")

    @property
    def enabled(self) -> bool:
        """Whether there is an adapter at all (rank > 0)."""
        return self.rank > 0

    @property
    def scaling(self) -> float:
        """The factor of B A in the update: alpha / rank."""
        return self.alpha / self.rank

    def same_adapter(self, other: LoraParams) -> bool:
        """Whether ``other`` describes adapters of the same shape and scale (the seed aside)."""
        return dataclasses.replace(self, seed=0) == dataclasses.replace(other, seed=0)


PLACEMENTS = {"pack": "STRICT_PACK", "spread": "STRICT_SPREAD"}  # cluster.placement -> Ray placement group strategy


@dataclass(frozen=True)
class VerlParams:
    """Where and how wide the verl workers run (``cluster`` of a recipe)."""

    num_workers: int = 1  # data-parallel FSDP ranks (one Ray actor each); a recipe's: cluster.workers
    ray_address: str | None = None  # an existing Ray cluster; None starts one here
    num_cpus: int | None = None  # CPUs for a locally started Ray; None: Ray counts them
    use_gpu: bool = False  # one GPU per worker (nccl); False: CPU workers (gloo)
    placement: str = "pack"  # "pack": every worker on one node; "spread": one node each
    strategy: str = "fsdp2"  # verl's FSDP flavour: "fsdp2" (fully_shard) or "fsdp"
    seed: int = DEFAULT_SEED  # verl's engine seed
    threads: int | None = None  # torch threads of each CPU worker; None: the node's cores // num_workers
    cores: CoreShare | None = None  # the board the CPU workers share the cores through with the explorer

    def __post_init__(self) -> None:
        if self.num_workers < 1:
            raise TrinityError(f"num_workers must be >= 1, got {self.num_workers}")
        if self.placement not in PLACEMENTS:
            raise TrinityError(f"placement {self.placement!r} unknown; expected one of {', '.join(PLACEMENTS)}")
        if self.strategy not in ("fsdp", "fsdp2"):
            raise TrinityError(f"verl strategy {self.strategy!r} unknown; expected fsdp2 or fsdp (fsdp2 on CPU)")


Dtype = Literal[
    "auto", "float32", "bfloat16"
]  # auto: by device (trinity_like/models/device.py); no fp16 (no CPU kernels worth using)
Scheduler = Literal["constant", "cosine"]  # learning rate after warm-up
AttnImplementation = Literal["sdpa", "eager"]  # transformers attention kernels

MODEL_KINDS = ("lm", "value", "reward")
SCHEDULES = get_args(Scheduler)
DTYPES = get_args(Dtype)


@dataclass(frozen=True)
class ModelParams:
    """What model an engine holds and how it runs it."""

    path: str  # Hugging Face folder (config, safetensors, tokenizer) to start from
    kind: str = "lm"  # "lm": logprobs of the response; "value": values [B, R]; "reward": scores [B]
    micro_batch_size: int = 8  # rows per forward/backward (per verl worker)
    share_prompts: bool = True  # each distinct prompt once per micro-batch (trainer/forward.py)
    dtype: str = (
        "auto"  # auto: by device (models/device.py); local bfloat16: the parameters; verl: compute over fp32 masters
    )
    device: str = "auto"  # the local engine's device: auto | cpu | cuda | cuda:N
    attn_implementation: str = "sdpa"  # transformers attention kernel
    forward_only: bool = False  # a frozen model (the reference policy): no optimiser, no grads
    gradient_checkpointing: bool = False  # recompute activations in backward to save memory
    head_seed: int = DEFAULT_SEED  # seed of the scalar head's initialisation when the folder has none
    lora: LoraParams | None = None  # LoRA adapters on a trainable LM (rank 0 or None: every weight trains)

    def __post_init__(self) -> None:
        if self.adapter is not None and (self.kind != "lm" or self.forward_only):
            what = "a frozen model" if self.forward_only else f"a {self.kind} model"
            raise TrinityError(f"LoRA adapts a trainable language model, not {what}")
        if self.kind not in MODEL_KINDS:
            raise TrinityError(f"model kind {self.kind!r} unknown; expected one of {', '.join(MODEL_KINDS)}")
        if self.dtype not in DTYPES:
            raise TrinityError(f"dtype {self.dtype!r} unknown; expected one of {', '.join(DTYPES)}")
        if self.micro_batch_size < 1:
            raise TrinityError(f"micro_batch_size must be >= 1, got {self.micro_batch_size}")

    @property
    def adapter(self) -> LoraParams | None:
        """The LoRA params when an adapter is trained (rank > 0), else None."""
        return self.lora if self.lora is not None and self.lora.enabled else None


@dataclass(frozen=True)
class OptimParams:
    """AdamW, gradient clipping and the learning-rate schedule (``trainer.optimizer`` of a recipe)."""

    lr: float = 1e-5  # peak learning rate
    betas: tuple[float, float] = (0.9, 0.999)  # AdamW moment decay rates
    weight_decay: float = 0.0  # AdamW decoupled weight decay
    eps: float = 1e-8  # AdamW denominator epsilon
    grad_clip: float = 1.0  # max global gradient L2 norm; 0: no clipping
    warmup_steps: int = 0  # linear warmup from 0 to ``lr``, in optimiser steps
    scheduler: str = "constant"  # after warmup: "constant" or "cosine" decay
    total_steps: int = -1  # optimiser steps of the whole run (derived: cosine only)
    min_lr_ratio: float = 0.0  # cosine floor as a fraction of ``lr``

    def __post_init__(self) -> None:
        if self.scheduler not in SCHEDULES:
            raise TrinityError(f"lr schedule {self.scheduler!r} unknown; expected one of {', '.join(SCHEDULES)}")
        if self.scheduler == "cosine" and self.total_steps <= 0:
            raise TrinityError("the cosine lr schedule needs total_steps > 0")


@dataclass(frozen=True)
class AdamStep:
    """One optimiser step's own hyper-parameters, in place of the schedule's (the client's ``AdamParams``).

    A caller that drives the learning rate itself (Tinker's ``optim_step(AdamParams(...))``)
    passes one per step; the recipe path passes none and follows :class:`OptimParams`.
    """

    lr: float  # learning rate of this step
    betas: tuple[float, float]  # AdamW moment decay rates
    eps: float  # AdamW denominator epsilon
    weight_decay: float  # decoupled weight decay
    grad_clip: float  # max global gradient L2 norm; 0: no clipping

    def __post_init__(self) -> None:
        if self.lr < 0 or self.eps <= 0 or self.weight_decay < 0 or self.grad_clip < 0:
            raise TrinityError(f"AdamStep: lr, weight_decay, grad_clip must be >= 0 and eps > 0, got {self}")
        if not all(0.0 <= b < 1.0 for b in self.betas):
            raise TrinityError(f"AdamStep: betas must be in [0, 1), got {self.betas}")

    def apply(self, optimizer) -> None:
        """Set this step's values on every param group of a torch AdamW ``optimizer``."""
        for group in optimizer.param_groups:
            group.update(lr=self.lr, betas=self.betas, eps=self.eps, weight_decay=self.weight_decay)


def lr_factor(step: int, params: OptimParams) -> float:
    """Multiplier of ``params.lr`` at the 0-indexed optimiser ``step``.

    Warmup is linear from 0 (so with ``warmup_steps > 0`` the very first step has lr 0, as
    in Hugging Face's and verl's schedules); cosine then follows a half cosine from 1 down
    to ``min_lr_ratio`` at ``total_steps`` (Loshchilov & Hutter, SGDR, 2017).
    """
    if step < params.warmup_steps:
        return step / max(1, params.warmup_steps)
    if params.scheduler == "constant":
        return 1.0
    progress = (step - params.warmup_steps) / max(1, params.total_steps - params.warmup_steps)
    coef, intercept = (1 - params.min_lr_ratio) * 0.5, (1 + params.min_lr_ratio) * 0.5
    return max(params.min_lr_ratio, math.cos(math.pi * progress) * coef + intercept)
