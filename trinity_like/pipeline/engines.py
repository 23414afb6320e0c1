"""Build the train engines a stage needs (actor, reference, critic) from its config."""

from __future__ import annotations

from typing import Any

from trinity_like.trainer.params import ModelParams, OptimParams


def optim_params(stage: Any, *, critic: bool = False) -> OptimParams:
    cfg = stage.config
    o = cfg.trainer.critic_optimizer if critic else cfg.trainer.optimizer
    return OptimParams(
        lr=o.lr,
        betas=tuple(o.betas),
        weight_decay=o.weight_decay,
        eps=o.eps,
        clip_grad=o.grad_clip,
        warmup_steps=o.warmup_steps,
        schedule=o.scheduler,
        total_steps=cfg.trainer.total_steps * cfg.trainer.update_epochs,
        min_lr_ratio=o.min_lr_ratio,
    )


def model_params(stage: Any, path: str, *, kind: str = "lm", forward_only: bool = False) -> ModelParams:
    cfg = stage.config
    return ModelParams(
        path=path,
        kind=kind,
        micro_batch_size=cfg.trainer.micro_batch_size,
        dtype=cfg.model.dtype,
        attn_implementation=cfg.model.attn_implementation,
        forward_only=forward_only,
        head_seed=cfg.seed,
    )


def make_engine(stage: Any, path: str, *, kind: str = "lm", forward_only: bool = False, critic: bool = False) -> Any:
    """A train engine of the stage's kind (``trainer.engine``) over the model folder ``path``."""
    cfg = stage.config
    mp = model_params(stage, path, kind=kind, forward_only=forward_only)
    op = optim_params(stage, critic=critic)
    if cfg.trainer.engine == "local":
        from trinity_like.trainer.local_engine import LocalEngine

        return LocalEngine(mp, op)
    from trinity_like.trainer.verl_engine import VerlEngine, VerlParams

    vp = VerlParams(
        num_workers=cfg.cluster.trainer_workers,
        ray_address=cfg.cluster.ray_address,
        num_cpus=cfg.cluster.num_cpus,
        seed=cfg.seed,
    )
    return VerlEngine(mp, op, vp)
