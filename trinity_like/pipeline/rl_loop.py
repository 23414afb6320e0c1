"""The RL loop, top to bottom: explore, buffer, sample a batch, advantages, loss, optimiser, sync.

Start reading here. One synchronous loop in one process (the train engine may still be
verl's FSDP workers on Ray, the explorer a Ray actor). It is typed against the protocol
:class:`~.verbs.StageVerbs`, never the concrete stage, and owns its own state
(:class:`~.steps.LoopState`). One step of GRPO reads top to bottom in :func:`step`, this
file and :mod:`.steps`; the loss itself is :mod:`trinity_like.trainer.objective`::

    tasks   = next explorer.batch_size tasks                       stage.explore  (resumable order)
    rows    = workflow(tasks): group_size samples each, rewarded        [explorer]
    buffer.put(rows)                                                    stage.put  [SQLite by default]
    batch   = sample_strategy.sample(buffer, train_batch_size)         learn -> stage.next_batch
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
explorer in the background, exploring while the trainer trains: the same :func:`step` with
hooks of its own (:class:`~.steps.StepHooks`), as mode ``train`` and the benchmarks use it.
Either records when each actor was busy in ``<run_dir>/timeline.jsonl``.

The offline loop (:mod:`.offline_loop`: SFT, DPO, RM) reuses :class:`~.steps.LoopState`,
:func:`~.steps.update` and :func:`~.steps.end_step`.
"""

from __future__ import annotations

import torch

from trinity_like.components import call_component
from trinity_like.errors import TrinityError
from trinity_like.monitor.logger import PhaseTimer
from trinity_like.ops import apply_kl_penalty, groups_with_signal, normalizers
from trinity_like.pipeline.batching import split_rows, trained_records
from trinity_like.pipeline.steps import LoopState, StepHooks, StepRecord, end_step, update
from trinity_like.pipeline.verbs import StageVerbs
from trinity_like.trainer.objective import gap_past_bound, sampler_gap

Batch = dict[str, torch.Tensor]


def begin(stage: StageVerbs) -> LoopState:
    """An online loop's start: its state from the latest checkpoint; before the first step of a
    fresh run, the learned reward checked against the gold one (``monitor.rm_check_tasks``) and
    the held-out evaluation (``monitor.eval_at_start``), both logged at step 0."""
    loop = LoopState.resume(stage)
    params = stage.params
    if loop.step == 0 and params.rm_check_tasks and (checked := stage.check_rewards(params.rm_check_tasks)) is not None:
        stage.log(0, checked)
    if loop.step == 0 and params.eval_at_start and (at_start := stage.evaluate(0)):
        stage.log(0, at_start)
    return loop


def finish(stage: StageVerbs, last: dict[str, float]) -> dict[str, float]:
    """An online loop's end: the held-out evaluation of the final weights, logged at the last step."""
    total = stage.params.total_steps
    if final := stage.evaluate(total):
        stage.log(total, final)
        last.update(final)
    return last


class InTurn(StepHooks):
    """The in-turn loop's step: the explorer explores before the trainer trains, keeping
    ``synchronizer.offset`` batches ahead of it (the off-policy window)."""

    def feed(self, stage: StageVerbs, loop: LoopState, rec: StepRecord) -> None:
        total, offset = stage.params.total_steps, stage.params.sync_offset
        explored = loop.step if loop.explored is None else loop.explored
        while explored - rec.step < offset and explored < total:
            explored += 1
            with rec.timer("rollout"), stage.span("explorer", "rollout", explored):
                rows, explore_metrics = stage.explore(explored)
            rec.metrics.update(explore_metrics)
            with rec.timer("buffer_write"):
                stage.put(rows, explored)
            loop.explored = explored


IN_TURN = InTurn()
FED = StepHooks()  # mode train: an explorer process writes the batches


def step(stage: StageVerbs, loop: LoopState, hooks: StepHooks = IN_TURN) -> dict[str, float]:
    """Step ``loop.step + 1`` of an online loop: its batch into the buffer (``hooks.feed``), sample
    and train on it (:func:`learn`), then sync, evaluate, log, checkpoint (:func:`.steps.end_step`).
    Returns the step's metrics. Every online loop steps through here, with its own hooks."""
    rec = StepRecord(loop.step + 1)
    hooks.feed(stage, loop, rec)
    with stage.span("trainer", "update", rec.step), hooks.training(stage):
        learned, rec.tokens = learn(stage, loop, rec.step, rec.timer)
    rec.metrics.update(learned)
    end_step(stage, loop, rec, hooks)
    return rec.metrics


def run_online(stage: StageVerbs, loop: LoopState | None = None) -> dict[str, float]:
    """Mode ``both``, in turn: explore and train ``stage`` after the loop's step (the latest
    checkpoint's, or ``loop``'s when given) up to ``trainer.total_steps``; returns the last metrics."""
    loop = begin(stage) if loop is None else loop
    last: dict[str, float] = {}
    while loop.step < stage.params.total_steps:
        last = step(stage, loop, IN_TURN)
    return finish(stage, last)


def run_trainer(stage: StageVerbs) -> dict[str, float]:
    """Mode ``train``: the trainer alone, fed by an explorer process through the shared buffer.

    Weights are published to ``<run_dir>/sync`` for the explorer (:mod:`.weight_channel`);
    a claim waits until the explorer has written a full batch.
    """
    loop = begin(stage)
    last: dict[str, float] = {}
    while loop.step < stage.params.total_steps:
        last = step(stage, loop, FED)
    return last


# -- the trainer's half of a step ------------------------------------------------------------
def learn(stage: StageVerbs, loop: LoopState, step: int, timer: PhaseTimer) -> tuple[dict[str, float], int]:
    """Sample a batch (:meth:`~.verbs.StageVerbs.next_batch`) and take one optimiser step on it.

    A step short of rows (skipped tasks, in a stage that explores itself) trains on what the
    buffer holds, and a step with none is skipped (``skipped/short_batch_rows``,
    ``skipped/empty_batch``). A batch whose groups all have equal rewards (dynamic sampling
    drops them all: ``skipped/no_signal``) or whose loss is not finite trains nothing.
    Returns the metrics and the tokens trained on (0: none).
    """
    with timer("sample"):
        rows, short = stage.next_batch(step, loop.model_version)
    if not rows:
        loop.model_version = step
        return short, 0
    batch: Batch | None = stage.collate(rows)
    metrics = {**short, **rollout_stats(batch, loop.model_version)}
    if stage.params.dynamic_sampling:
        batch, metrics["dynamic_sampling/dropped_rows"], keep = drop_uninformative_groups(batch)
        rows = [rows[i] for i in keep.tolist()]
    tokens = 0
    if batch is None:
        metrics["skipped/no_signal"] = 1.0
        dropped = int(metrics["dynamic_sampling/dropped_rows"])
        stage.note(f"step {step}: every group's rewards are equal: dynamic sampling dropped all {dropped} rows")
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
            if (recorder := stage.recorder()) is not None:
                with timer("record"):  # for people (trinity-like view): what the loss saw, no extra pass
                    recorder.record_trained(step, trained_records(rows, batch, outputs))
    loop.model_version = step
    return metrics, tokens


def check_gap(stage: StageVerbs, step: int, batch: Batch, outputs: Batch) -> dict[str, float]:
    """The sampler-trainer gap of the whole batch, from the first epoch's forward (the weights that
    sampled it, on-policy), checked against ``trainer.sampler_gap`` before the optimiser step: past
    the bound, ``stop`` ends the run with one line and the weights untouched; ``warn`` logs the line."""
    if "logprob" not in outputs or "rollout_logprob" not in batch:
        return {}
    gap = sampler_gap(outputs["logprob"], batch["rollout_logprob"], batch["response_mask"], batch["is_expert"])
    line = gap_past_bound(gap, step, stage.params.gap_max_kl_k3)
    if line is not None and stage.params.gap_stop:
        stage.learner().actor.zero_grad()  # this batch's gradients never reach the weights
        raise TrinityError(line + "; stopping before the step (trainer.sampler_gap.action: warn only warns)")
    if line is not None:
        stage.note("warning: " + line)
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


def prepare_rl_batch(stage: StageVerbs, batch: Batch, timer: PhaseTimer) -> dict[str, float]:
    """What the losses read besides the policy's own logprobs: reference and old logprobs,
    critic values (each only when a component asks for it), then advantages."""
    trainer = stage.learner()
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


def compute_advantages(stage: StageVerbs, batch: Batch) -> dict[str, float]:
    """Fill ``batch["advantages"]`` and ``batch["returns"]`` in place; returns metrics.

    1. KL shaping (slot ``kl_penalty``): ``r_t - coef * KL_t(sampler || ref)`` on the
       token-level rewards, before advantages (InstructGPT eq. 2; REINFORCE++).
    2. The advantage fn (slot ``advantage``) gets exactly the inputs it declares; group
       methods (GRPO, RLOO) see the whole batch, so every group is complete.
    """
    params = stage.params
    metrics: dict[str, float] = {}
    mask = batch["response_mask"]
    if (comp := params.kl_penalty) is not None:
        sampler = batch.get("old_logprob", batch["rollout_logprob"])
        kl_BR = call_component(comp.fn, {"logprob": sampler, "ref_logprob": batch["ref_logprob"]})
        batch["token_level_rewards"], m = apply_kl_penalty(
            batch["token_level_rewards"], kl_BR, mask, coef=float(comp.coef or 0.0)
        )
        metrics.update(m)
    if (comp := params.advantage) is None:
        return metrics
    adv_BR, ret_BR = call_component(comp.fn, {**batch, "action_mask": mask}, comp.params)
    batch["advantages"], batch["returns"] = adv_BR.detach().float(), ret_BR.detach().float()
    valid = mask > 0
    if valid.any():
        metrics["advantages/mean"] = float(batch["advantages"][valid].mean())
        metrics["advantages/abs_mean"] = float(batch["advantages"][valid].abs().mean())
    return metrics
