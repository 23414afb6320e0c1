"""What every loop's step shares: the loop's own state, one step's record, how a step ends.

- :class:`LoopState` -- what a loop owns, not the stage: where it is, its NaN streak, what it
  saves in each checkpoint beside the stage's state.
- :class:`StepRecord` -- what one step gathers as it runs: its phase times, metrics, tokens.
- :class:`StepHooks` -- how a loop's step differs from the in-turn loop's: where its batch
  comes from, what wraps the update, how weights are synced, what is evaluated, what
  happens before a checkpoint. Each default is the stage's own verb; a loop (or a
  benchmark) subclasses and overrides, never patches a stage.
- :func:`update` -- ``trainer.update_epochs`` optimiser steps with the non-finite-loss limit.
- :func:`end_step` -- sync, evaluate, log, checkpoint.

:func:`.rl_loop.step` puts them together for the online loops; :mod:`.offline_loop` uses
:func:`update` and :func:`end_step` with a hook of its own.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import Any

import torch

from trinity_like.errors import TrinityError
from trinity_like.monitor.logger import PhaseTimer
from trinity_like.pipeline.verbs import StageVerbs

Batch = dict[str, torch.Tensor]
Prepare = Callable[[StageVerbs, Batch, PhaseTimer], dict[str, float]]  # adds what the losses read to a batch


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
    explored: int | None = None  # the last step whose batch is in the buffer (None: ``step``'s; not saved)

    @classmethod
    def resume(cls, stage: StageVerbs) -> LoopState:
        """The state the latest checkpoint saved, restoring the stage's with it (fresh: all zero)."""
        step, saved = stage.load_checkpoint()
        return cls(step=step, model_version=int(saved.pop("model_version", step)), extra=saved)

    def saved(self) -> dict[str, Any]:
        """What a checkpoint keeps of the loop's state."""
        return {"model_version": self.model_version, **self.extra}


@dataclass
class StepRecord:
    """One step as it runs: its number, phase times, metrics, and the tokens it trained on (0: none)."""

    step: int
    timer: PhaseTimer = field(default_factory=PhaseTimer)
    t0: float = field(default_factory=time.perf_counter)
    metrics: dict[str, float] = field(default_factory=dict)
    tokens: int = 0


class StepHooks:
    """How a loop's step differs from the in-turn loop's (:func:`.rl_loop.step`). This base is
    the trainer fed by an explorer process (mode ``train``): the batch is in the buffer already,
    and every other hook is the stage's own verb."""

    def feed(self, stage: StageVerbs, loop: LoopState, rec: StepRecord) -> None:
        """Put step ``rec.step``'s batch into the buffer, its metrics into ``rec``."""

    def training(self, stage: StageVerbs) -> AbstractContextManager[Any]:
        """What wraps the trainer's half of the step."""
        return nullcontext()

    def sync(self, stage: StageVerbs, version: int) -> dict[str, float]:
        """The trainer's weights to the explorer as ``version``; returns the time of its parts, if any."""
        return stage.sync_weights(version)

    def evaluate(self, stage: StageVerbs, step: int) -> dict[str, float]:
        """Held-out metrics at the end of ``step``."""
        return stage.evaluate(step)

    def before_checkpoint(self, stage: StageVerbs, loop: LoopState, step: int) -> None:
        """Runs just before the checkpoint of ``step`` is written."""

    def checkpoint(self, stage: StageVerbs, loop: LoopState, step: int) -> None:
        """Write the checkpoint of ``step`` with the loop's state."""
        stage.save_checkpoint(step, loop.saved())


def update(
    stage: StageVerbs,
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
    trainer, params = stage.learner(), stage.params
    try:
        metrics = prepare(stage, batch, timer) if prepare is not None else {}
        with timer("update"):
            for epoch in range(params.update_epochs):
                with timer("update.forward_backward"):
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
                with timer("update.optim_step"):
                    stepped = trainer.actor.optim_step()
                metrics.update({f"actor/{k}": v for k, v in stepped.items()})
            if trainer.critic is not None:
                out = trainer.critic.forward_backward(batch, trainer.value_objective)
                metrics.update({f"critic/{k}": v for k, v in out.items()})
                metrics.update({f"critic/{k}": v for k, v in trainer.critic.optim_step().items()})
    except FloatingPointError as exc:
        loop.nan_streak += 1
        stage.note(f"step {step}: {exc}; step skipped ({loop.nan_streak} in a row)")
        limit = params.max_nan_steps
        if loop.nan_streak > limit:
            raise TrinityError(
                f"step {step}: {loop.nan_streak} non-finite losses in a row (trainer.max_nan_steps="
                f"{limit}); stopping with the weights of the last good step"
            ) from None
        return {"skipped/nan_loss": 1.0}
    loop.nan_streak = 0
    # the batch's real tokens (each row's prompt and response, padding left out) over the epochs: the
    # work a trainer that runs every row whole does (perf/train_tokens: what the engine ran)
    metrics["perf/batch_tokens"] = float(batch["attention_mask"].sum()) * params.update_epochs
    return metrics


def end_step(stage: StageVerbs, loop: LoopState, rec: StepRecord, hooks: StepHooks) -> None:
    """Sync weights, evaluate, log and checkpoint the end of step ``rec.step``.

    Weights go to the explorer (``hooks.sync``) every ``synchronizer.interval`` steps of an
    online stage, and at the last step when an explorer process waits for them (``train``
    mode) to evaluate the final model; ``hooks.evaluate`` every ``monitor.eval_interval``
    steps but the last (the loop evaluates the final weights itself).

    ``throughput/tokens_per_s`` is the tokens trained on (prompt and response, padding left
    out) over ``time/step``; a step that trained nothing (no rows, no signal, a non-finite
    loss) logs no throughput rather than a rate of 0.

    The step's metrics are logged *before* its checkpoint: a run killed in between redoes the
    step from the previous checkpoint and logs it again (readers keep a step's last line), while
    the other order would lose the line of a step that the checkpoint had already kept. The
    checkpoint's own time follows on a line of its own (``time/checkpoint``); ``time/step``
    leaves it out.
    """
    params, step, timer, metrics = stage.params, rec.step, rec.timer, rec.metrics
    total = params.total_steps
    if params.use_rollout and (step % params.sync_interval == 0 or (step == total and params.sync_at_end)):
        with timer("sync"), stage.span("trainer", "sync", step):
            metrics.update(hooks.sync(stage, step) or {})
    if params.eval_interval and step % params.eval_interval == 0 and step != total:
        with timer("eval"), stage.span("trainer", "eval", step):
            metrics.update(hooks.evaluate(stage, step))
    metrics.update(timer.metrics())
    metrics.update(stage.memory())
    metrics["time/step"] = time.perf_counter() - rec.t0
    if rec.tokens:
        metrics["throughput/tokens_per_s"] = rec.tokens / max(metrics["time/step"], 1e-9)
    stage.log(step, metrics)
    if step % params.checkpoint_interval == 0 or step == total:
        hooks.before_checkpoint(stage, loop, step)
        t1 = time.perf_counter()
        with stage.span("trainer", "checkpoint", step):
            hooks.checkpoint(stage, loop, step)
        stage.log(step, {"time/checkpoint": time.perf_counter() - t1})
    loop.step = step
    stage.advance()
