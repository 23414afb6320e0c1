"""A reusable RL training loop over the Tinker-compatible client and the env API.

``examples/client/rl_basic.py`` is the loop to read; this is the one to reuse (its parts
are in :mod:`.core`, the sampling stream of streaming and off-by-K in :mod:`.stream`). It trains
any ``ENV`` environment -- single- or multi-turn, see :mod:`trinity_like.envs` -- with a
:class:`~trinity_like.client.training.TrainingClient`, in the spirit of tinker-cookbook's
``rl/train.py``. One iteration::

    builders = the next batch_size tasks, a group of group_size envs each
    episodes = rollout_groups(builders) on a SamplingClient of the current weights   time/rollout
    ref      = the base model's logprobs of every episode (kl_penalty_coef > 0 only) time/reference
    r'       = step rewards - kl_penalty_coef * KL(pi || ref) of each turn's tokens
    A        = ADVANTAGE_FN[advantage](r') per episode, or per turn from returns-to-go
               (default group_centered: r' - its group's mean)
    datums   = one per episode: loss on the policy's tokens only, each carrying its A
    num_substeps x (forward_backward(minibatch, loss_fn); optim_step)               time/update
    sampler  = save_weights_and_get_sampling_client()                               time/sync
    every save_every: save_state (resumable); every eval_every: greedy held-out accuracy

A group whose env failed (a step that kept raising or timed out) is dropped from its
iteration and counted (``rollout/dropped_groups``); each distinct failure is written once,
with the env's name and the error. An iteration that drops more than
``max_dropped_fraction`` of its groups stops the run with the first one's error.

Advantages come from the advantage fn registered as ``config.advantage`` in ADVANTAGE_FN (the
registry a recipe's ``algorithm.advantage`` uses; :mod:`.advantages` says what it is given),
so ``rloo``, ``grpo`` (``advantage_params={"norm_by_std": False}`` is Dr.GRPO) or a plugin's
estimator is one field away. The default, ``group_centered``, is the group's mean as the
baseline, with no std and no length normalisation. Episode i of a group plays turns
t = 0..T_i-1 with step rewards r_it (its group reward added to its last turn), shaped as r'_it = r_it - beta * KL_it where KL_it = sum over the tokens of action t
of log pi_sampler(a) - log pi_ref(a): the k1 estimator summed over the turn, whose
expectation is the KL of the turn's tokens (the sampler's logprobs are the policy's at
temperature 1). The penalty is part of the reward, never of the loss.

With ``group_centered``:

- default: A_i = R_i - mean_j R_j with R_i = sum_t r'_it, on every policy token of episode i.
- ``advantage_per_turn``: A_it = G_it - mean_j G_jt with G_it = sum_{s >= t} r'_is, the
  return-to-go from turn t (0 for an episode that ended before turn t); the tokens of
  action t get A_it, so a reward earned before turn t does not credit turn t. Turn 0 gets
  the default advantage, and so does every turn when all episodes of the group have as
  many turns and are rewarded at their last one only. Another estimator takes the place
  of "minus the mean" in both (the per-turn estimator sees the group's returns-to-go of
  turn t).

A group whose advantages are all 0 (a group-relative estimator, rewards all equal) is, by
default, left out of the batch (``train/skipped_groups``): it would cost a forward and
backward and teach nothing.

This file's loop is synchronous: sample the whole batch, then train. ``num_minibatches``
(streaming: train each minibatch as soon as its groups are sampled) and
``max_steps_off_policy`` (K: sample with weights up to K iterations old while the learner
trains) run the same stages on :mod:`cookbook.rl.stream`'s sampling stream;
``docs/async.md`` explains them and their trade-offs (``ppo`` or ``tis`` for K > 0).

Example::

    from trinity_like.client import ServiceClient
    from cookbook.rl.train import RLTrainConfig, train
    from cookbook.envs.calculator import calculator_tasks
    from trinity_like.envs.dataset import build_env_factory

    training = ServiceClient().create_lora_training_client("smollm2-135m-instruct", rank=0, seed=0)
    factory = build_env_factory("calculator", {"max_turns": 3}, tokenizer=training.get_tokenizer())
    result = train(RLTrainConfig(log_path="runs/calc", iterations=20), training, factory,
                   calculator_tasks("train", 160), calculator_tasks("eval", 100))
    result.evals[0]["eval/accuracy"], result.evals[-1]["eval/accuracy"]
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from cookbook.rl.advantages import Estimator, group_advantages, turn_advantages
from cookbook.rl.core import (  # the loop's parts, importable from here
    CHECKPOINTS,
    RL_LOSSES,
    Episode,
    Pending,
    RLTrainConfig,
    TrainResult,
    build_rows,
    check_drops,
    collect,
    episode_datum,
    evaluate,
    group_episodes,
    minibatches,
    reference_kl,
    resume,
    sample_episodes,
    save_checkpoint,
    submit_minibatch,
    train_step,
)
from trinity_like.client.sampling import SamplingClient
from trinity_like.client.training import TrainingClient
from trinity_like.envs.dataset import TaskEnvDataset
from trinity_like.envs.guard import DropNotices
from trinity_like.envs.types import EnvFactory
from trinity_like.experience import Task
from trinity_like.explorer.engine import sample_seed
from trinity_like.monitor.logger import MetricsLogger, PhaseTimer

__all__ = [
    "CHECKPOINTS",
    "RL_LOSSES",
    "Episode",
    "Estimator",
    "Pending",
    "RLTrainConfig",
    "TrainResult",
    "build_rows",
    "check_drops",
    "collect",
    "episode_datum",
    "evaluate",
    "group_advantages",
    "group_episodes",
    "minibatches",
    "reference_kl",
    "resume",
    "sample_episodes",
    "save_checkpoint",
    "submit_minibatch",
    "train",
    "train_step",
    "turn_advantages",
]


def train(
    config: RLTrainConfig,
    training: TrainingClient,
    factory: EnvFactory,
    train_tasks: Sequence[Task],
    eval_tasks: Sequence[Task] = (),
) -> TrainResult:
    """Train ``training`` on ``factory``'s envs of ``train_tasks`` (batches in order, cycled);
    evaluate on ``eval_tasks``; resume from ``config.log_path``'s last checkpoint if it has one."""
    dataset = TaskEnvDataset(train_tasks, factory, batch_size=config.batch_size, group_size=config.group_size)
    log_path = Path(config.log_path)
    log_path.mkdir(parents=True, exist_ok=True)
    start = resume(training, log_path)
    reference = SamplingClient(training.base_model) if config.kl_penalty_coef > 0 else None  # frozen base weights
    logger = MetricsLogger(
        str(log_path),
        ("jsonl",),
        total_steps=config.iterations,
        start_step=start,
        progress=config.progress,
        desc="rl_train",
    )
    result = TrainResult(start, [])
    notices = DropNotices(logger.write)  # each distinct env failure written once

    def log(step: int, metrics: dict[str, float]) -> None:
        logger.log(step, metrics)
        result.metrics.append({"step": step, **metrics})

    stream = None
    try:
        if start:
            logger.write(f"resumed from the checkpoint of iteration {start} in {log_path / CHECKPOINTS}")
        sampler = training.save_weights_and_get_sampling_client()
        do_eval = bool(eval_tasks) and config.eval_every != 0
        for line in _setting_notices(config, train_tasks, eval_tasks):
            logger.write(line)
        if do_eval and start == 0 and config.eval_at_start:
            log(0, evaluate(sampler, factory, eval_tasks, config, notices))
        if config.streaming:  # streaming minibatches / off-by-K: the samplers run beside the learner
            from cookbook.rl.stream import ChunkStream, stream_iteration

            stream = ChunkStream(config, dataset, sampler, start=start, reference=reference)
        for it in range(start + 1, config.iterations + 1):
            timer, t0 = PhaseTimer(), time.perf_counter()
            if stream is not None:
                groups, metrics = stream_iteration(stream, training, config, it, timer, logger.write, notices)
            else:  # the synchronous loop: sample the whole batch, then train on it
                with timer("rollout"):
                    rollout = sample_episodes(
                        sampler,
                        dataset.get_batch((it - 1) % len(dataset)),
                        seed=sample_seed(config.seed, it, 0),
                        params=config.rollout(),
                    )
                notices(f"iteration {it}", rollout.dropped)
                check_drops(config, rollout.dropped, it)  # before training on what is left
                groups = [group_episodes(g, it - 1) for g in rollout.groups]
                metrics = dict(rollout.metrics)
                if reference is not None:
                    with timer("reference"):
                        metrics.update(reference_kl(reference, [ep for g in groups for ep in g]))
                rows, built = build_rows(groups, config)
                metrics.update(built)
                with timer("update"):
                    metrics.update(train_step(training, rows, config))
            with timer("sync"):
                sampler = training.save_weights_and_get_sampling_client()
                if stream is not None:
                    stream.publish(sampler, it)
            last = it == config.iterations
            if config.save_every and (it % config.save_every == 0 or last):
                with timer("checkpoint"):
                    save_checkpoint(training, log_path, it)
            if do_eval and (last or (config.eval_every and it % config.eval_every == 0)):
                with timer("eval"):
                    metrics.update(evaluate(sampler, factory, eval_tasks, config, notices))
            metrics.update(_speed(timer, t0, groups, metrics))
            log(it, metrics)
            logger.advance()
    finally:
        if stream is not None:
            stream.close()
        logger.close()
    return result


def _setting_notices(config: RLTrainConfig, train_tasks: Sequence[Task], eval_tasks: Sequence[Task]) -> list[str]:
    """Lines for settings that would otherwise surprise: held-out tasks never evaluated, and held-out
    prompts under another system prompt than the training ones (a recipe's held-out source inherits it)."""
    out = []
    if eval_tasks and config.eval_every == 0:
        out.append("eval_every=0: the held-out tasks are never evaluated (None: at the start and the end only)")
    trained = {t.system_prompt for t in train_tasks if isinstance(t.prompt, str)}
    held_out = {t.system_prompt for t in eval_tasks if isinstance(t.prompt, str)}
    if trained and held_out and trained != held_out:
        out.append(
            f"warning: the held-out tasks' system prompt {', '.join(sorted(map(repr, held_out)))} differs from the "
            f"training tasks' {', '.join(sorted(map(repr, trained)))}: pass the same system_prompt to both load_tasks calls"
        )
    return out


def _speed(
    timer: PhaseTimer, t0: float, groups: Sequence[Sequence[Episode]], metrics: Mapping[str, float]
) -> dict[str, float]:
    """Per-stage seconds and tokens per second (sampled, trained, whole iteration)."""
    out = timer.metrics()
    out["time/step"] = time.perf_counter() - t0
    episodes = [ep for g in groups for ep in g]
    sampled = sum(end - start for ep in episodes for start, end in ep.spans)
    out["response_length/mean"] = sampled / max(len(episodes), 1)  # policy tokens per episode
    sampling_s = metrics.get("async/sampling_s", out.get("time/rollout", 0.0))  # the stream's: its own wall time
    out["throughput/sample_tokens_per_s"] = sampled / max(sampling_s, 1e-9)
    if metrics.get("train/policy_tokens"):
        out["throughput/train_tokens_per_s"] = metrics["train/policy_tokens"] / max(out["time/update"], 1e-9)
    out["throughput/tokens_per_s"] = sum(len(ep.tokens_T) for ep in episodes) / max(out["time/step"], 1e-9)
    return out
