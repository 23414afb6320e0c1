"""The readable reference loop of online RL: explore, buffer, sample, train, sync, evaluate.

One synchronous loop in one process (the train engine may still be verl's FSDP workers
on Ray). Per step::

    tasks   = next explorer.batch_size tasks                  (resumable dataset order)
    rows    = workflow(tasks): group_size samples each, rewarded   [explorer]
    buffer.put(rows)                                               [SQLite by default]
    batch   = sample_strategy.sample(buffer, train_batch_size)
    batch   = drop groups of equal rewards (dynamic sampling)      [DAPO]
    ref / old logprobs, critic values as the components need them
    advantages = advantage_fn(rewards, groups, ...)                [trainer]
    forward_backward(objective); optim_step
    every sync_interval steps: explorer weights <- trainer weights
    every checkpoint.interval steps: checkpoint, then buffer.commit(step)

Off-policy: the explorer may run ``synchronizer.offset`` steps ahead of the trainer, so
with offset k the batch trained at step t was sampled by the weights of step t - k;
each row records the version that produced it and staleness is logged.
"""

from __future__ import annotations

import math
import time
from typing import Any

import torch

from trinity_like.errors import TrinityError
from trinity_like.pipeline.advantages import compute_advantages, drop_uninformative_groups
from trinity_like.pipeline.batching import experience_batch
from trinity_like.pipeline.context import StageContext
from trinity_like.pipeline.metrics import PhaseTimer


def rollout_stats(batch: dict[str, torch.Tensor], model_version: int) -> dict[str, float]:
    """Reward, response length and staleness (trainer version - sampler version) of the sampled rows.

    A MIX batch also holds expert rows: their reward (0), length and version (0) say nothing
    about the policy, so they are left out and counted under ``expert_rows``.
    """
    sampled = ~batch["is_expert"].bool()
    out = {"expert_rows": float((~sampled).sum())} if not sampled.all() else {}
    if not sampled.any():
        return out
    rewards = batch["rewards"][sampled].float()
    lengths = (batch["response_mask"][sampled] > 0).sum(-1).float()
    staleness = (model_version - batch["model_version"][sampled]).float()
    return {
        **out,
        "reward/mean": float(rewards.mean()), "reward/std": float(rewards.std(unbiased=False)),
        "response_length/mean": float(lengths.mean()), "response_length/max": float(lengths.max()),
        "staleness/mean": float(staleness.mean()), "staleness/max": float(staleness.max()),
    }


def train_on_batch(ctx: StageContext, batch: dict[str, torch.Tensor], timer: PhaseTimer) -> dict[str, float]:
    """One optimiser step of the actor (and the critic) on an experience batch."""
    stage = ctx.stage
    metrics: dict[str, float] = {}
    needs = ctx.batch_needs
    if "ref_logprob" in needs:
        with timer("reference"):
            batch["ref_logprob"] = ctx.reference.compute_logprobs(batch)["logprob"]
    if "old_logprob" in needs and not ctx.objective.on_policy:
        with timer("old_logprob"):
            batch["old_logprob"] = ctx.actor.compute_logprobs(batch)["logprob"]
    if ctx.critic is not None:
        with timer("values"):
            batch["values"] = ctx.critic.compute_logprobs(batch)["values"]
            batch["old_values"] = batch["values"]
    with timer("advantage"):
        metrics.update(compute_advantages(stage, batch))
    with timer("update"):
        for _ in range(stage.config.trainer.update_epochs):
            out = ctx.actor.forward_backward(batch, ctx.objective, need_entropy=ctx.objective.need_entropy)
            if out.get("nonfinite_loss", 0.0) > 0 or not math.isfinite(out.get("loss", 0.0)):
                ctx.actor.zero_grad()  # drop what the finite micro-batches accumulated
                raise FloatingPointError("non-finite loss")
            metrics.update(out)
            metrics.update({f"actor/{k}": v for k, v in ctx.actor.optim_step().items()})
        if ctx.critic is not None:
            out = ctx.critic.forward_backward(batch, ctx.value_objective)
            metrics.update({f"critic/{k}": v for k, v in out.items()})
            metrics.update({f"critic/{k}": v for k, v in ctx.critic.optim_step().items()})
    return metrics


def learn(ctx: StageContext, step: int, timer: PhaseTimer) -> tuple[dict[str, float], dict[str, torch.Tensor] | None]:
    """The trainer's half of a step: sample a batch from the buffer and take one optimiser step on it.

    Returns the metrics and the batch trained on (None when dynamic sampling left nothing).
    """
    cfg = ctx.stage.config
    metrics: dict[str, float] = {}
    with timer("sample"):
        rows = ctx.strategy.sample(
            experiences=ctx.storage, batch_size=ctx.train_batch_size, model_version=ctx.model_version,
            expert=ctx.expert,
        )
    if not rows:
        raise TrinityError(f"step {step}: the buffer gave no experiences (explorer produced none?)")
    batch = experience_batch(rows, ctx.pad_id)
    metrics.update(rollout_stats(batch, ctx.model_version))
    if ctx.stage.dynamic_sampling:
        batch, dropped = drop_uninformative_groups(batch)
        metrics["dynamic_sampling/dropped_rows"] = float(dropped)
    if batch is None:
        metrics["skipped/no_signal"] = 1.0
    else:
        try:
            metrics.update(train_on_batch(ctx, batch, timer))
            ctx.nan_streak = 0
        except FloatingPointError as exc:
            ctx.nan_streak += 1
            metrics["skipped/nan_loss"] = 1.0
            ctx.logger.write(f"step {step}: {exc}; step skipped ({ctx.nan_streak} in a row)")
            if ctx.nan_streak > cfg.trainer.max_nan_steps:
                raise TrinityError(
                    f"step {step}: {ctx.nan_streak} non-finite losses in a row (trainer.max_nan_steps="
                    f"{cfg.trainer.max_nan_steps}); stopping with the weights of the last good step"
                ) from None
    ctx.model_version = step
    return metrics, batch


def end_step(ctx: StageContext, step: int, timer: PhaseTimer, t0: float, metrics: dict[str, float],
             batch: dict[str, torch.Tensor] | None) -> None:
    """Sync weights, evaluate, checkpoint and log the end of ``step``.

    Weights go out every ``synchronizer.interval`` steps, and at the last step when an
    explorer process waits for them (``train`` mode) to evaluate the final model.
    """
    cfg = ctx.stage.config
    total = cfg.trainer.total_steps
    if step % cfg.synchronizer.interval == 0 or (step == total and cfg.mode == "train"):
        with timer("sync"):
            ctx.sync_weights(step)
    if cfg.monitor.eval_interval and step % cfg.monitor.eval_interval == 0 and step != total and ctx.eval_tasks:
        with timer("eval"):
            metrics.update(ctx.evaluate())
    if step % cfg.checkpoint.interval == 0 or step == total:
        with timer("checkpoint"):
            ctx.checkpoint(step)
    metrics.update(timer.metrics())
    metrics["time/step"] = time.perf_counter() - t0
    tokens = float((batch["attention_mask"].sum()) if batch is not None else 0.0)
    metrics["throughput/tokens_per_s"] = tokens / max(metrics["time/step"], 1e-9)
    ctx.log(step, metrics)
    ctx.logger.advance()


def run_online(ctx: StageContext) -> dict[str, float]:
    """Train ``ctx.stage`` from ``ctx.start_step`` to ``trainer.total_steps``; returns the last metrics."""
    cfg = ctx.stage.config
    total = cfg.trainer.total_steps
    offset = cfg.synchronizer.offset
    last: dict[str, float] = {}
    if cfg.monitor.eval_at_start and ctx.eval_tasks is not None and ctx.start_step == 0:
        ctx.log(0, ctx.evaluate())
    pending: list[list[Any]] = []  # explored batches waiting for the trainer (off-policy window)
    for step in range(ctx.start_step + 1, total + 1):
        timer = PhaseTimer()
        t0 = time.perf_counter()
        metrics: dict[str, float] = {}
        # -- explore: keep `offset` batches ahead of the trainer --------------------------
        while len(pending) <= offset and step + len(pending) <= total:
            with timer("rollout"):
                rows, explore_metrics = ctx.explore(step + len(pending))
            metrics.update(explore_metrics)
            with timer("buffer_write"):
                ctx.storage.put(rows)
            pending.append(rows)
        pending.pop(0)
        # -- sample a batch, train, sync, checkpoint, log -------------------------------------
        learned, batch = learn(ctx, step, timer)
        metrics.update(learned)
        end_step(ctx, step, timer, t0, metrics, batch)
        last = metrics
    if ctx.eval_tasks is not None:
        final = ctx.evaluate()
        ctx.log(total, final)
        last.update(final)
    return last


def run_train(ctx: StageContext) -> dict[str, float]:
    """``train`` mode: the trainer alone, fed by an explorer process through the shared buffer.

    Weights are published to ``<run_dir>/sync`` for the explorer (:mod:`.sync`); a claim
    waits until the explorer has written a full batch.
    """
    total = ctx.stage.config.trainer.total_steps
    last: dict[str, float] = {}
    for step in range(ctx.start_step + 1, total + 1):
        timer = PhaseTimer()
        t0 = time.perf_counter()
        metrics, batch = learn(ctx, step, timer)
        end_step(ctx, step, timer, t0, metrics, batch)
        last = metrics
    return last
