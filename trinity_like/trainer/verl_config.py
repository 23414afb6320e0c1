"""The ``verl`` engine's parameters (:class:`VerlParams`: where and how wide its workers run; a
recipe's ``cluster``, turned into them by :mod:`trinity_like.config.engine_params`) and verl's worker configuration for them (``TrainingWorkerConfig``).

Precision: verl keeps fp32 master weights and optimiser state and computes in the
mixed-precision ``param_dtype``: bf16 where :func:`~trinity_like.models.device.train_dtypes`
gives bf16 compute for the workers' device (``dtype: auto`` on GPUs) or ``dtype: bfloat16``
asks for it, fp32 otherwise (every CPU default). A frozen model is stored in that dtype.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from trinity_like.cpu_share import CoreShare
from trinity_like.errors import TrinityError
from trinity_like.models.device import train_dtypes
from trinity_like.trainer import lora as lora_lib
from trinity_like.trainer.lora_adapter import DEFAULT_SEED
from trinity_like.trainer.params import ModelParams, OptimParams

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
    weights, compute = train_dtypes(model.dtype, torch.device("cuda" if use_gpu else "cpu"))
    dtype = "bf16" if torch.bfloat16 in (weights, compute) else "fp32"
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
