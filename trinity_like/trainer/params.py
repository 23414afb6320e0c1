"""Typed parameters shared by every train engine, and the learning-rate schedule.

Both engines read the same :class:`ModelParams` and :class:`OptimParams`, so a recipe
switches engines without touching its optimiser settings, and the schedule below is the
one verl's FSDP engine applies (``verl.utils.torch_functional``'s warmup + constant /
cosine ``LambdaLR``; the test compares the two), so both engines step with the same
learning rate at every step.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from trinity_like.errors import TrinityError

MODEL_KINDS = ("lm", "value", "reward")
SCHEDULES = ("constant", "cosine")
DTYPES = ("float32", "bfloat16")


@dataclass(frozen=True)
class ModelParams:
    """What model an engine holds and how it runs it."""

    path: str  # Hugging Face folder (config, safetensors, tokenizer) to start from
    kind: str = "lm"  # "lm": logprobs of the response; "value": values [B, R]; "reward": scores [B]
    micro_batch_size: int = 4  # rows per forward/backward pass (per worker for the verl engine)
    dtype: str = "float32"  # "float32" or "bfloat16" (local: the parameters; verl: compute over fp32 masters)
    attn_implementation: str = "sdpa"  # transformers attention kernel; "sdpa" or "eager" on CPU
    forward_only: bool = False  # a frozen model (the reference policy): no optimiser, no grads
    gradient_checkpointing: bool = False  # recompute activations in backward to save memory
    head_seed: int = 0  # seed of the scalar head's initialisation when the folder has none

    def __post_init__(self) -> None:
        if self.kind not in MODEL_KINDS:
            raise TrinityError(f"model kind {self.kind!r} unknown; expected one of {', '.join(MODEL_KINDS)}")
        if self.dtype not in DTYPES:
            raise TrinityError(f"dtype {self.dtype!r} unknown; expected one of {', '.join(DTYPES)}")
        if self.micro_batch_size < 1:
            raise TrinityError(f"micro_batch_size must be >= 1, got {self.micro_batch_size}")


@dataclass(frozen=True)
class OptimParams:
    """AdamW, gradient clipping and the learning-rate schedule."""

    lr: float = 1e-6  # peak learning rate
    betas: tuple[float, float] = (0.9, 0.999)  # AdamW moment decay rates
    weight_decay: float = 0.01  # AdamW decoupled weight decay
    eps: float = 1e-8  # AdamW denominator epsilon
    clip_grad: float = 1.0  # max global gradient L2 norm before the step
    warmup_steps: int = 0  # linear warmup from 0 to ``lr`` over this many optimiser steps
    schedule: str = "constant"  # after warmup: "constant" or "cosine" decay
    total_steps: int = -1  # optimiser steps of the whole run (cosine only)
    min_lr_ratio: float = 0.0  # cosine floor as a fraction of ``lr``

    def __post_init__(self) -> None:
        if self.schedule not in SCHEDULES:
            raise TrinityError(f"lr schedule {self.schedule!r} unknown; expected one of {', '.join(SCHEDULES)}")
        if self.schedule == "cosine" and self.total_steps <= 0:
            raise TrinityError("the cosine lr schedule needs total_steps > 0")


def lr_factor(step: int, params: OptimParams) -> float:
    """Multiplier of ``params.lr`` at the 0-indexed optimiser ``step``.

    Warmup is linear from 0 (so with ``warmup_steps > 0`` the very first step has lr 0, as
    in Hugging Face's and verl's schedules); cosine then follows a half cosine from 1 down
    to ``min_lr_ratio`` at ``total_steps`` (Loshchilov & Hutter, SGDR, 2017).
    """
    if step < params.warmup_steps:
        return step / max(1, params.warmup_steps)
    if params.schedule == "constant":
        return 1.0
    progress = (step - params.warmup_steps) / max(1, params.total_steps - params.warmup_steps)
    coef, intercept = (1 - params.min_lr_ratio) * 0.5, (1 + params.min_lr_ratio) * 0.5
    return max(params.min_lr_ratio, math.cos(math.pi * progress) * coef + intercept)
