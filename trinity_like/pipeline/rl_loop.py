"""The RL loop, top to bottom: explore, buffer, sample a batch, advantages, loss, optimiser, sync.

Start reading here. One synchronous loop in one process (the train engine may still be
verl's FSDP workers on Ray, the explorer a Ray actor). It drives a :class:`~.stage.Stage`
through the verbs of :class:`~.stage.StageVerbs` and owns its own state
(:class:`LoopState`). One step of GRPO reads top to bottom in this file and :mod:`.stage`;
the loss itself is :mod:`trinity_like.trainer.objective`::

    tasks   = next explorer.batch_size tasks                       stage.explore  (resumable order)
    rows    = workflow(tasks): group_size samples each, rewarded        [explorer]
    buffer.put(rows)                                                    stage.put  [SQLite by default]
    batch   = sample_strategy.sample(buffer, train_batch_size)         learn
    batch   = drop groups of equal rewards (dynamic sampling, DAPO)
    ref / old logprobs, critic values -- only what a component asks for
    advantages = advantage_fn(rewards, groups, ...)                     compute_advantages
    forward_backward(objective); optim_step                             update
    every sync_interval steps: explorer weights <- trainer weights      end_step -> stage.sync_weights
    log the step's metrics; every checkpoint.interval steps: stage.save_checkpoint, then buffer.commit(step)

Off-policy: the explorer may run ``synchronizer.offset`` steps ahead of the trainer, so
with offset k the batch trained at step t was sampled by the weights of step t - 1 - k;
each row records the version that produced it and staleness is logged. This loop takes
the turns one after the other (the reference); with offset >= 1 (and ``synchronizer.concurrent``)
the runner runs :func:`.async_loop.run_concurrent` instead: the same schedule with the
explorer in the background, exploring while the trainer trains, built from the pieces here.
Either records when each actor was busy in ``<run_dir>/timeline.jsonl``.

The offline loop (:mod:`.offline_loop`: SFT, DPO, RM) reuses :class:`LoopState`,
:func:`update` and :func:`end_step`.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from trinity_like.buffer.base import TrainingRecorder
from trinity_like.components import call_component
from trinity_like.errors import TrinityError
from trinity_like.experience import Experience
from trinity_like.monitor.logger import PhaseTimer
from trinity_like.ops import apply_kl_penalty, groups_with_signal, normalizers
from trinity_like.pipeline.batching import experience_batch, split_rows, trained_records
from trinity_like.pipeline.stage import Stage
from trinity_like.trainer.objective import gap_past_bound, sampler_gap

Batch = dict[str, torch.Tensor]
Prepare = Callable[[Stage, Batch, PhaseTimer], dict[str, float]]  # adds what the losses read to a batch


@dataclass
class LoopState:
    """What a loop owns, not the stage: where it is, its NaN streak, and what it saves in each
    checkpoint beside the stage's weights and data positions (:meth:`saved`)."""

    step: int = 0  # the last step finished; a resumed loop continues after it
    model_version: int = 0  # the trainer's weights: the last step trained
    nan_streak: int = 0  # steps skipped in a row for a non-finite loss (not saved: a resumed run counts afresh)
    extra: dict[str, Any] = field(
        default_factory=dict
    )  # a loop's own keys saved with checkpoints (async: its next batch)

    @classmethod
    def resume(cls, stage: Stage) -> LoopState:
        """The state the latest checkpoint saved, restoring the stage's with it (fresh: all zero)."""
        step, saved = stage.load_checkpoint()
        return cls(step=step, model_version=int(saved.pop("model_version", step)), extra=saved)

    def saved(self) -> dict[str, Any]:
        """What a checkpoint keeps of the loop's state."""
        return {"model_version": self.model_version, **self.extra}


def begin(stage: Stage) -> LoopState:
    """An online loop's start: its state from the latest checkpoint; before the first step of a
    fresh run, the learned reward checked against the gold one (``monitor.rm_check_tasks``) and
    the held-out evaluation (``monitor.eval_at_start``), both logged at step 0."""
    loop = LoopState.resume(stage)
    cfg = stage.config
    if loop.step == 0 and stage.reward_watch is not None and cfg.monitor.rm_check_tasks:
        tasks = (stage.data.eval_tasks or [])[: cfg.monitor.rm_check_tasks]
        metrics, line = stage.reward_watch.check_at_start(stage.explorer, tasks)
        stage.run.logger.write(line)
        stage.log(0, metrics)
    if loop.step == 0 and cfg.monitor.eval_at_start and stage.data.eval_tasks:
        stage.log(0, stage.evaluate(0))
    return loop


def finish(stage: Stage, last: dict[str, float]) -> dict[str, float]:
    """An online loop's end: the held-out evaluation of the final weights, logged at the last step."""
    total = stage.config.trainer.total_steps
    if stage.data.eval_tasks:
        final = stage.evaluate(total)
        stage.log(total, final)
        last.update(final)
    return last


def run_online(stage: Stage, loop: LoopState | None = None) -> dict[str, float]:
    """Mode ``both``, in turn: explore and train ``stage`` after the loop's step (the latest
    checkpoint's, or ``loop``'s when given) up to ``trainer.total_steps``; returns the last metrics."""
    cfg = stage.config
    total, offset = cfg.trainer.total_steps, cfg.synchronizer.offset
    loop = begin(stage) if loop is None else loop
    last: dict[str, float] = {}
    pending: list[list[Experience]] = []  # explored batches waiting for the trainer (off-policy window)
    for step in range(loop.step + 1, total + 1):
        timer, t0 = PhaseTimer(), time.perf_counter()
        metrics: dict[str, float] = {}
        # -- explore: keep `offset` batches ahead of the trainer ------------------------------
        while len(pending) <= offset and step + len(pending) <= total:
            with timer("rollout"), stage.run.span("explorer", "rollout", step + len(pending)):
                rows, explore_metrics = stage.explore(step + len(pending))
            metrics.update(explore_metrics)
            with timer("buffer_write"):
                stage.put(rows, step + len(pending))
            pending.append(rows)
        pending.pop(0)
        # -- sample a batch, train, sync, checkpoint, log ---------------------------------------
        with stage.run.span("trainer", "update", step):
            learned, tokens = learn(stage, loop, step, timer)
        metrics.update(learned)
        end_step(stage, loop, step, timer, t0, metrics, tokens)
        last = metrics
    return finish(stage, last)


def run_trainer(stage: Stage) -> dict[str, float]:
    """Mode ``train``: the trainer alone, fed by an explorer process through the shared buffer.

    Weights are published to ``<run_dir>/sync`` for the explorer (:mod:`.weight_channel`);
    a claim waits until the explorer has written a full batch.
    """
    loop = begin(stage)
    last: dict[str, float] = {}
    for step in range(loop.step + 1, stage.config.trainer.total_steps + 1):
        timer, t0 = PhaseTimer(), time.perf_counter()
        with stage.run.span("trainer", "update", step):
            last, tokens = learn(stage, loop, step, timer)
        end_step(stage, loop, step, timer, t0, last, tokens)
    return last


# -- the trainer's half of a step ------------------------------------------------------------
def learn(stage: Stage, loop: LoopState, step: int, timer: PhaseTimer) -> tuple[dict[str, float], int]:
    """Sample a batch from the buffer and take one optimiser step on it.

    In mode ``both`` a step short of rows (skipped tasks) trains on what the buffer holds,
    and a step with none is skipped (``skipped/short_batch_rows``, ``skipped/empty_batch``);
    mode ``train`` waits for an explorer process to write a full batch. A batch whose groups
    all have equal rewards (dynamic sampling drops them all: ``skipped/no_signal``) or whose
    loss is not finite trains nothing. Returns the metrics and the tokens trained on (0: none).
    """
    size = stage.spec.train_batch_size
    short: dict[str, float] = {}  # what a step short of rows misses (mode both)
    if stage.role == "both":  # this process wrote every row the step will get: waiting for more would hang
        available = stage.storage.count("available")
        if available == 0:
            stage.run.logger.write(f"step {step}: exploration produced no rows (every task skipped); step skipped")
            loop.model_version = step
            return {"skipped/empty_batch": 1.0}, 0
        if available < size:
            stage.run.logger.write(
                f"step {step}: {available} rows explored for a batch of {size} "
                f"(buffer.train_batch_size); training on them"
            )
            size, short = available, {"skipped/short_batch_rows": float(size - available)}
    with timer("sample"):
        rows = stage.strategy.sample(
            experiences=stage.storage, batch_size=size, model_version=loop.model_version, expert=stage.data.expert
        )
    if not rows:
        raise TrinityError(f"step {step}: the buffer gave no experiences (explorer produced none?)")
    if stage.ledger is not None:  # every row was sampled by weights the trainer sent (weight_ledger)
        stage.ledger.check(step, rows, loop.model_version)
    batch: Batch | None = experience_batch(rows, stage.pad_id)
    metrics = {**short, **rollout_stats(batch, loop.model_version)}
    if stage.spec.dynamic_sampling:
        batch, metrics["dynamic_sampling/dropped_rows"], keep = drop_uninformative_groups(batch)
        rows = [rows[i] for i in keep.tolist()]
    tokens = 0
    if batch is None:
        metrics["skipped/no_signal"] = 1.0
        dropped = int(metrics["dynamic_sampling/dropped_rows"])
        stage.run.logger.write(
            f"step {step}: every group's rewards are equal: dynamic sampling dropped all {dropped} rows"
        )
    else:
        outputs: Batch = {}
        gap: dict[str, float] = {}
        metrics.update(
            update(
                stage,
                loop,
                step,
                batch,
                timer,
                prepare=prepare_rl_batch,
                outputs=outputs,
                before_step=lambda: gap.update(check_gap(stage, step, batch, outputs)),
            )
        )
        if "skipped/nan_loss" not in metrics:
            tokens = int(batch["attention_mask"].sum())
            metrics.update(gap)
            if isinstance(stage.storage, TrainingRecorder):
                with timer("record"):  # for people (trinity-like view): what the loss saw, no extra pass
                    stage.storage.record_trained(step, trained_records(rows, batch, outputs))
    loop.model_version = step
    return metrics, tokens


def check_gap(stage: Stage, step: int, batch: Batch, outputs: Batch) -> dict[str, float]:
    """The sampler-trainer gap of the whole batch, from the first epoch's forward (the weights that
    sampled it, on-policy), checked against ``trainer.sampler_gap`` before the optimiser step: past
    the bound, ``stop`` ends the run with one line and the weights untouched; ``warn`` logs the line."""
    if "logprob" not in outputs or "rollout_logprob" not in batch:
        return {}
    gap = sampler_gap(outputs["logprob"], batch["rollout_logprob"], batch["response_mask"], batch["is_expert"])
    bound = stage.config.trainer.sampler_gap
    line = gap_past_bound(gap, step, bound.max_kl_k3)
    if line is not None and bound.action == "stop":
        stage.trainer.actor.zero_grad()  # this batch's gradients never reach the weights
        raise TrinityError(line + "; stopping before the step (trainer.sampler_gap.action: warn only warns)")
    if line is not None:
        stage.run.logger.write("warning: " + line)
        gap["train/sampler_gap_warnings"] = 1.0
    return gap


def rollout_stats(batch: Batch, model_version: int) -> dict[str, float]:
    """Reward, response length and staleness (trainer version - sampler version) of the sampled rows.

    Expert rows (MIX) were never sampled: their reward (0), length and version (0) say nothing
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
        "reward/mean": float(rewards.mean()),
        "reward/std": float(rewards.std(unbiased=False)),
        "response_length/mean": float(lengths.mean()),
        "response_length/max": float(lengths.max()),
        "staleness/mean": float(staleness.mean()),
        "staleness/max": float(staleness.max()),
    }


def drop_uninformative_groups(batch: Batch) -> tuple[Batch | None, float, torch.Tensor]:
    """Dynamic sampling (DAPO, arXiv:2503.14476 sec. 3.2): under a group baseline a group whose
    rewards are all equal carries no signal. Such groups are dropped; expert rows (MIX) are
    demonstrations, not groups, and always stay. Returns the batch (None if empty), the rows
    dropped and the indices of the rows kept."""
    keep_B = groups_with_signal(batch["rewards"], batch["group_index"]) | batch["is_expert"].bool()
    keep = keep_B.nonzero(as_tuple=True)[0]
    dropped = float(batch["rewards"].shape[0] - keep.numel())
    if keep.numel() == 0:
        return None, dropped, keep
    if dropped == 0:
        return batch, 0.0, keep
    out = split_rows(batch, keep)
    out.update(normalizers(out["response_mask"], out.get("is_expert")))
    return out, dropped, keep


def prepare_rl_batch(stage: Stage, batch: Batch, timer: PhaseTimer) -> dict[str, float]:
    """What the losses read besides the policy's own logprobs: reference and old logprobs,
    critic values (each only when a component asks for it), then advantages."""
    trainer = stage.trainer
    if "ref_logprob" in trainer.needs:
        with timer("reference"):
            batch["ref_logprob"] = trainer.reference.compute_logprobs(batch)["logprob"]
    if "old_logprob" in trainer.needs and not trainer.objective.one_update:
        with timer("old_logprob"):
            batch["old_logprob"] = trainer.actor.compute_logprobs(batch)["logprob"]
    if trainer.critic is not None:
        with timer("values"):
            batch["values"] = trainer.critic.compute_logprobs(batch)["values"]
            batch["old_values"] = batch["values"]
    with timer("advantage"):
        return compute_advantages(stage, batch)


def compute_advantages(stage: Stage, batch: Batch) -> dict[str, float]:
    """Fill ``batch["advantages"]`` and ``batch["returns"]`` in place; returns metrics.

    1. KL shaping (slot ``kl_penalty``): ``r_t - coef * KL_t(sampler || ref)`` on the
       token-level rewards, before advantages (InstructGPT eq. 2; REINFORCE++).
    2. The advantage fn (slot ``advantage``) gets exactly the inputs it declares; group
       methods (GRPO, RLOO) see the whole batch, so every group is complete.
    """
    comps = stage.spec.components
    metrics: dict[str, float] = {}
    mask = batch["response_mask"]
    if "kl_penalty" in comps:
        comp = comps["kl_penalty"]
        sampler = batch.get("old_logprob", batch["rollout_logprob"])
        kl_BR = call_component(comp.fn, {"logprob": sampler, "ref_logprob": batch["ref_logprob"]})
        batch["token_level_rewards"], m = apply_kl_penalty(
            batch["token_level_rewards"], kl_BR, mask, coef=float(comp.coef or 0.0)
        )
        metrics.update(m)
    if "advantage" not in comps:
        return metrics
    comp = comps["advantage"]
    adv_BR, ret_BR = call_component(comp.fn, {**batch, "action_mask": mask}, comp.params)
    batch["advantages"], batch["returns"] = adv_BR.detach().float(), ret_BR.detach().float()
    valid = mask > 0
    if valid.any():
        metrics["advantages/mean"] = float(batch["advantages"][valid].mean())
        metrics["advantages/abs_mean"] = float(batch["advantages"][valid].abs().mean())
    return metrics


# -- shared by every loop ------------------------------------------------------------------------
def update(
    stage: Stage,
    loop: LoopState,
    step: int,
    batch: Batch,
    timer: PhaseTimer,
    *,
    prepare: Prepare | None = None,
    outputs: Batch | None = None,
    before_step: Callable[[], None] | None = None,
) -> dict[str, float]:
    """``trainer.update_epochs`` optimiser steps of the actor (then one of the critic) on ``batch``.

    ``prepare(stage, batch, timer)`` first adds what the losses read (reference logprobs,
    advantages, ...). A non-finite loss skips the step without touching the weights; more
    than ``trainer.max_nan_steps`` in a row (``loop.nan_streak``) stop the run with the last
    good weights. ``outputs``, when given, receives the actor's outputs of the first epoch
    (``logprob [B, R]``, ...: the weights before this step), from the forward the loss ran;
    ``before_step()`` runs after that forward and before the first optimiser step.
    """
    trainer = stage.trainer
    try:
        metrics = prepare(stage, batch, timer) if prepare is not None else {}
        with timer("update"):
            for epoch in range(stage.config.trainer.update_epochs):
                out = trainer.actor.forward_backward(
                    batch,
                    trainer.objective,
                    need_entropy=trainer.objective.need_entropy,
                    out=outputs if epoch == 0 else None,
                )
                if out.get("nonfinite_loss", 0.0) > 0 or not math.isfinite(out.get("loss", 0.0)):
                    trainer.actor.zero_grad()  # drop what the finite micro-batches accumulated
                    raise FloatingPointError("non-finite loss")
                metrics.update(out)
                if epoch == 0 and before_step is not None:
                    before_step()
                metrics.update({f"actor/{k}": v for k, v in trainer.actor.optim_step().items()})
            if trainer.critic is not None:
                out = trainer.critic.forward_backward(batch, trainer.value_objective)
                metrics.update({f"critic/{k}": v for k, v in out.items()})
                metrics.update({f"critic/{k}": v for k, v in trainer.critic.optim_step().items()})
    except FloatingPointError as exc:
        loop.nan_streak += 1
        stage.run.logger.write(f"step {step}: {exc}; step skipped ({loop.nan_streak} in a row)")
        limit = stage.config.trainer.max_nan_steps
        if loop.nan_streak > limit:
            raise TrinityError(
                f"step {step}: {loop.nan_streak} non-finite losses in a row (trainer.max_nan_steps="
                f"{limit}); stopping with the weights of the last good step"
            ) from None
        return {"skipped/nan_loss": 1.0}
    loop.nan_streak = 0
    return metrics


def end_step(
    stage: Stage,
    loop: LoopState,
    step: int,
    timer: PhaseTimer,
    t0: float,
    metrics: dict[str, float],
    tokens: int,
    evaluate: Callable[[int], dict[str, float]] | None = None,
    sync: Callable[[int], None] | None = None,
    before_checkpoint: Callable[[int], None] | None = None,
) -> None:
    """Sync weights, evaluate, log and checkpoint the end of ``step``; ``tokens``: what it trained on.

    Weights go to the explorer every ``synchronizer.interval`` steps of an online stage, and
    at the last step when an explorer process waits for them (``train`` mode) to evaluate
    the final model. ``evaluate`` replaces :meth:`Stage.evaluate` (an offline stage's held-out
    loss), ``sync`` :meth:`Stage.sync_weights` (the background explorer's published snapshots);
    ``before_checkpoint(step)`` runs just before a checkpoint is written.

    ``throughput/tokens_per_s`` is the tokens trained on (prompt and response, padding left
    out) over ``time/step``; a step that trained nothing (no rows, no signal, a non-finite
    loss) logs no throughput rather than a rate of 0.

    The step's metrics are logged *before* its checkpoint: a run killed in between redoes the
    step from the previous checkpoint and logs it again (readers keep a step's last line), while
    the other order would lose the line of a step that the checkpoint had already kept. The
    checkpoint's own time follows on a line of its own (``time/checkpoint``); ``time/step``
    leaves it out.
    """
    cfg = stage.config
    total = cfg.trainer.total_steps
    if stage.spec.algorithm.use_rollout and (
        step % cfg.synchronizer.interval == 0 or (step == total and cfg.mode == "train")
    ):
        with timer("sync"), stage.run.span("trainer", "sync", step):
            (sync or stage.sync_weights)(step)
    if cfg.monitor.eval_interval and step % cfg.monitor.eval_interval == 0 and step != total:
        with timer("eval"), stage.run.span("trainer", "eval", step):
            metrics.update((evaluate or stage.evaluate)(step))
    metrics.update(timer.metrics())
    metrics.update(stage.memory())
    metrics["time/step"] = time.perf_counter() - t0
    if tokens:
        metrics["throughput/tokens_per_s"] = tokens / max(metrics["time/step"], 1e-9)
    stage.log(step, metrics)
    if step % cfg.checkpoint.interval == 0 or step == total:
        if before_checkpoint is not None:
            before_checkpoint(step)
        t1 = time.perf_counter()
        with stage.run.span("trainer", "checkpoint", step):
            stage.save_checkpoint(step, loop.saved())
        stage.log(step, {"time/checkpoint": time.perf_counter() - t1})
    loop.step = step
    stage.run.logger.advance()
