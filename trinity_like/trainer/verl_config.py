"""The ``verl`` engine's parameters (:class:`VerlParams`: where and how wide its workers run; a
recipe's ``cluster``, turned into them by :mod:`trinity_like.config.engine_params`) and verl's worker configuration for them (``TrainingWorkerConfig``).

Precision: verl keeps fp32 master weights and optimiser state and computes in the
mixed-precision ``param_dtype``: bf16 where :func:`~trinity_like.models.device.train_dtypes`
gives bf16 compute for the workers' device (``dtype: auto`` on GPUs) or ``dtype: bfloat16``
asks for it, fp32 otherwise (every CPU default). A frozen model is stored in that dtype.
"""

from __future__ import annotations

import torch

from trinity_like.models.device import train_dtypes
from trinity_like.trainer import lora as lora_lib
from trinity_like.trainer.params import PLACEMENTS, ModelParams, OptimParams, VerlParams  # noqa: F401 -- re-exported


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
