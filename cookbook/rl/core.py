"""The building blocks of :mod:`cookbook.rl.train`'s loop: its config, episodes, the datums
(advantages by :mod:`.advantages`) and the training step, evaluation and checkpoints.

:mod:`.train` (the synchronous loop) and :mod:`.stream` (streaming minibatches and
off-by-K sampling) both build on these; read :mod:`.train`'s docstring for what one
iteration does.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from itertools import pairwise
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tinker import types

from cookbook.rl.advantages import DEFAULT, Estimator, group_advantages
from trinity_like.client.losses import CLIENT_LOSSES, RL_INPUTS, THRESHOLDS, loss_spec
from trinity_like.client.sampling import SamplingClient
from trinity_like.client.training import TrainingClient
from trinity_like.envs.experience import trajectory_experience
from trinity_like.envs.guard import DropNotices, DroppedGroup, check_dropped
from trinity_like.envs.rollout import (
    GroupRollout,
    RolloutParams,
    RolloutResult,
    eval_env_metrics,
    rollout_groups,
)
from trinity_like.envs.types import EnvFactory, EnvGroupBuilder
from trinity_like.errors import ConfigError
from trinity_like.experience import Task
from trinity_like.monitor.jsonl import JsonlAppender
from trinity_like.monitor.sinks import read_jsonl_metrics
from trinity_like.ops import kept_groups, ratio_metrics
from trinity_like.plugins import load_plugins

RL_LOSSES = tuple(name for name, loss in CLIENT_LOSSES.items() if loss.inputs == RL_INPUTS)
CHECKPOINTS = "checkpoints.jsonl"  # in log_path: one {"iteration", "path"} line per save_state
_KINDS = {"int": int, "float": (int, float), "bool": bool, "str": str}


@dataclass(frozen=True)
class RLTrainConfig:
    """The loop's knobs (module docstring); a bad value is a one-line ConfigError naming its field."""

    log_path: str  # run folder: metrics.jsonl, checkpoints.jsonl; one holding checkpoints is resumed
    iterations: int = 20  # sampling iterations
    batch_size: int = 8  # env groups (tasks) per iteration: tinker-cookbook's groups_per_batch
    group_size: int = 8  # episodes per group: the group an advantage fn compares an episode with
    num_substeps: int = 1  # optimiser steps per iteration, each over its own disjoint minibatch of episodes
    num_minibatches: int = 0  # streaming: forward_backward calls per substep, each on its share of the groups as soon as they are sampled; 0: sample the whole batch, then train
    max_steps_off_policy: int = (
        0  # K: sample with weights up to K iterations old while the learner trains; 0: on-policy (docs/async.md)
    )
    loss_fn: str = "importance_sampling"  # a Tinker loss on (logprobs, advantages): see RL_LOSSES
    loss_fn_config: Mapping[str, float] = field(default_factory=dict)  # e.g. ppo's {"clip_high_threshold": 1.28}
    learning_rate: float = 1e-5  # AdamW
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-8
    weight_decay: float = 0.0
    grad_clip_norm: float = 1.0  # 0: no clipping
    kl_penalty_coef: float = 0.0  # beta of the shaping r - beta * KL(pi || ref); 0: no reference pass at all
    advantage: str = (
        DEFAULT  # ADVANTAGE_FN name: group_centered (r - group mean), grpo, rloo, a plugin's (cookbook.rl.advantages)
    )
    advantage_params: Mapping[str, Any] = field(
        default_factory=dict
    )  # that fn's params, e.g. grpo's {"norm_by_std": False}
    advantage_per_turn: bool = False  # each turn's advantage from its return-to-go (module docstring)
    skip_zero_advantage_groups: bool = True  # leave groups whose advantages are all 0 out of the batch (counted)
    max_total_tokens: int = 2048  # tokens of one episode, history and actions (an action's length is the env's)
    max_turns: int = 64  # actions per episode, a safety net over the env's own end
    eval_every: int | None = (
        5  # greedy held-out evaluation every this many iterations, at the start (eval_at_start) and the end; None: at the start and the end only; 0: never (as a recipe's monitor.eval_interval)
    )
    eval_at_start: bool = True  # evaluate before the first iteration (as a recipe's monitor.eval_at_start)
    save_every: int = 10  # save_state every this many iterations and at the end; 0: never (nothing to resume)
    seed: int = 0  # of the rollouts' sampling: iteration i draws from sample_seed(seed, i, 0)
    progress: bool = True  # a tqdm progress bar
    max_dropped_fraction: float = 0.5  # more of an iteration's groups dropped (env failures) stops the run

    def __post_init__(self) -> None:
        for f in fields(self):
            kind, value = _KINDS.get(str(f.type)), getattr(self, f.name)
            if kind is not None and (not isinstance(value, kind) or (f.type != "bool" and isinstance(value, bool))):
                raise ConfigError(f"RLTrainConfig.{f.name}: expected {f.type}, got {value!r}")
        for name in ("iterations", "batch_size", "group_size", "num_substeps", "max_total_tokens", "max_turns"):
            self._check(name, getattr(self, name) >= 1, "must be >= 1")
        every = self.eval_every
        self._check(
            "eval_every",
            every is None or (isinstance(every, int) and not isinstance(every, bool) and every >= 0),
            "must be None (at the start and the end only) or >= 0 (0: never)",
        )
        self._check("save_every", self.save_every >= 0, "must be >= 0 (0: never)")
        self._check("num_minibatches", self.num_minibatches >= 0, "must be >= 0 (0: no streaming)")
        self._check("max_steps_off_policy", self.max_steps_off_policy >= 0, "must be >= 0 (0: on-policy)")
        self._check(
            "batch_size",
            self.batch_size >= self.chunks_per_iteration,
            f"must be >= num_substeps * num_minibatches = {self.chunks_per_iteration} (a group per minibatch)",
        )
        self._check("log_path", bool(self.log_path), "must name a folder")
        self._check("learning_rate", self.learning_rate > 0, "must be > 0")
        self._check("kl_penalty_coef", self.kl_penalty_coef >= 0, "must be >= 0")
        self._check("max_dropped_fraction", 0 <= self.max_dropped_fraction <= 1, "must be a fraction in [0, 1]")
        self._check("loss_fn", self.loss_fn in RL_LOSSES, f"must be one of {', '.join(RL_LOSSES)}")
        load_plugins()  # the losses and advantage fns are registry entries
        try:
            loss_spec(self.loss_fn, self.loss_fn_config)
        except ConfigError as exc:
            raise ConfigError(f"RLTrainConfig.{exc}") from None
        self._check("advantage_params", isinstance(self.advantage_params, Mapping), "must be a mapping")
        self.estimator()  # an unknown name, a bad param or an input the loop lacks fails here, not mid-run

    def estimator(self) -> Estimator:
        """The advantage fn ``advantage`` looked up in ADVANTAGE_FN, with its params object."""
        return Estimator.build(self.advantage, self.advantage_params, where="RLTrainConfig.advantage")

    def _check(self, name: str, ok: bool, why: str) -> None:
        if not ok:
            raise ConfigError(f"RLTrainConfig.{name}: {why}, got {getattr(self, name)!r}")

    @property
    def streaming(self) -> bool:
        """Whether iterations run on :mod:`cookbook.rl.stream`'s sampling stream."""
        return self.num_minibatches > 0 or self.max_steps_off_policy > 0

    @property
    def chunks_per_iteration(self) -> int:
        """Rollout calls per iteration on the stream: one per minibatch when streaming, else one."""
        return self.num_substeps * self.num_minibatches if self.num_minibatches else 1

    def adam(self) -> types.AdamParams:
        return types.AdamParams(
            learning_rate=self.learning_rate,
            beta1=self.beta1,
            beta2=self.beta2,
            eps=self.eps,
            weight_decay=self.weight_decay,
            grad_clip_norm=self.grad_clip_norm,
        )

    def rollout(self, *, greedy: bool = False) -> RolloutParams:
        # Training episodes sample at temperature 1: the losses' importance ratio compares the
        # learner's logprobs (temperature 1) with the sampler's, so any other temperature would
        # make every token's ratio wrong (a sharper sampler inflates the rare tokens' ratios).
        return RolloutParams(
            temperature=1.0, greedy=greedy, max_turns=self.max_turns, max_total_tokens=self.max_total_tokens
        )


# -- sampling episodes through a SamplingClient ---------------------------------------------------
class _SamplerEngine:
    """A SamplingClient as the engine :func:`rollout_groups` drives: the same engine, seeds,
    stop conditions and prefix reuse as a recipe's explorer, on the client's weights."""

    def __init__(self, sampler: SamplingClient) -> None:
        self.run = sampler.run_requests


def sample_episodes(
    sampler: SamplingClient, builders: Sequence[EnvGroupBuilder], *, seed: int, params: RolloutParams
) -> RolloutResult:
    """Every episode of ``builders`` sampled from ``sampler``'s weights (see :mod:`trinity_like.envs.rollout`)."""
    return rollout_groups(builders, engine=_SamplerEngine(sampler), seed=seed, params=params)


# -- episodes, advantages, datums -----------------------------------------------------------------
@dataclass
class Episode:
    """One episode as training data. Letters: T tokens of the whole episode."""

    tokens_T: list[int]  # every turn as sampled: the last observation, then the last action
    logprobs_T: list[float]  # the sampler's logprob of each policy token; 0.0 elsewhere
    spans: list[tuple[int, int]]  # [start, end) of each turn's action in tokens_T
    rewards: list[float]  # per turn; the group reward added to the last
    kl: list[float] = field(default_factory=list)  # per turn: sum of log pi_sampler - log pi_ref; [] without ref
    version: int = 0  # iterations the sampler's weights had trained when it sampled this episode

    def shaped_rewards(self, beta: float) -> list[float]:
        return [r - beta * k for r, k in zip(self.rewards, self.kl or [0.0] * len(self.rewards), strict=True)]


def group_episodes(group: GroupRollout, version: int = 0) -> list[Episode]:
    """The episodes of one group, laid out as :func:`trajectory_experience` lays out a row."""
    out = []
    for trajectory, group_reward in zip(group.trajectories, group.group_rewards, strict=True):
        row = trajectory_experience(trajectory, reward=0.0, group_id=group.group_id)
        spans = [(len(t.observation), len(t.observation) + len(t.action)) for t in trajectory.transitions]
        rewards = [t.reward for t in trajectory.transitions]
        rewards[-1] += group_reward
        out.append(Episode(row.tokens, [0.0] * row.prompt_length + list(row.logprobs), spans, rewards, version=version))
    return out


@dataclass
class _Row:
    """A datum and where its policy tokens are (datum position p predicts token p + 1)."""

    datum: types.Datum
    policy_P: np.ndarray  # positions whose target is a policy token
    sampler_P: np.ndarray  # the sampler's logprobs there
    advantages_P: np.ndarray


def episode_datum(episode: Episode, advantages: Sequence[float]) -> _Row:
    """The episode as one datum: the loss covers its action tokens, each with its turn's advantage."""
    adv_T = np.zeros(len(episode.tokens_T), dtype=np.float32)
    policy = np.zeros(len(episode.tokens_T), dtype=bool)
    for (start, end), a in zip(episode.spans, advantages, strict=True):
        adv_T[start:end], policy[start:end] = a, True
    lp_T = np.asarray(episode.logprobs_T, dtype=np.float32)
    datum = types.Datum(
        model_input=types.ModelInput.from_ints(episode.tokens_T[:-1]),
        loss_fn_inputs={
            "target_tokens": types.TensorData.from_numpy(np.asarray(episode.tokens_T[1:], dtype=np.int64)),
            "logprobs": types.TensorData.from_numpy(lp_T[1:]),
            "advantages": types.TensorData.from_numpy(adv_T[1:]),
        },
    )
    positions = np.flatnonzero(policy[1:])
    return _Row(datum, positions, lp_T[1:][positions], adv_T[1:][positions])


def minibatches(n: int, k: int) -> list[range]:
    """``min(n, k)`` contiguous disjoint ranges covering ``0..n-1``, sizes differing by at most one.

    >>> minibatches(7, 3), minibatches(2, 4)
    ([range(0, 2), range(2, 4), range(4, 7)], [range(0, 1), range(1, 2)])
    """
    k = min(n, k)
    bounds = [n * i // k for i in range(k + 1)] if k else [0]
    return [range(a, b) for a, b in pairwise(bounds)]


# -- the stages of an iteration -------------------------------------------------------------------
def reference_kl(reference: SamplingClient, episodes: Sequence[Episode]) -> dict[str, float]:
    """Set each episode's per-turn ``kl`` from the reference's logprobs of its tokens; return
    the per-token means of both estimators of KL(pi || ref) over the policy's tokens (Schulman,
    "Approximating KL divergence", 2020): k1 = log pi - log ref, k3 = (r - 1) - log r, r = ref / pi."""
    futures = [reference.compute_logprobs(types.ModelInput.from_ints(ep.tokens_T)) for ep in episodes]
    log_r: list[float] = []  # log(ref / pi) at every policy token
    for ep, future in zip(episodes, futures, strict=True):
        ref = future.result()
        turns = [[ref[j] - ep.logprobs_T[j] for j in range(start, end)] for start, end in ep.spans]
        ep.kl = [-sum(turn) for turn in turns]
        log_r += [x for turn in turns for x in turn]
    if not log_r:
        return {}
    kl = ratio_metrics(torch.tensor(log_r, dtype=torch.float64), torch.ones(len(log_r), dtype=torch.float64))
    return {"kl/ref_k1": kl["ppo_kl"], "kl/ref_k3": kl["approx_kl"]}


def episode_rows(groups: Sequence[Sequence[Episode]], config: RLTrainConfig) -> tuple[list[_Row], int, list[float]]:
    """The datums of ``groups``, trained together: their advantages come from one call of the
    config's advantage fn over all of them (:mod:`.advantages`); with the groups left out as all
    zero, and every episode's shaped return."""
    rewards = [[ep.shaped_rewards(config.kl_penalty_coef) for ep in episodes] for episodes in groups]
    advantages = group_advantages(rewards, config.estimator(), per_turn=config.advantage_per_turn) if groups else []
    flat = [[a for adv in group for a in adv] for group in advantages]
    keep = kept_groups(flat, baseline=0.0) if config.skip_zero_advantage_groups else [True] * len(flat)
    rows: list[_Row] = []
    for episodes, group, kept in zip(groups, advantages, keep, strict=True):
        if kept:
            rows += [episode_datum(ep, adv) for ep, adv in zip(episodes, group, strict=True)]
    skipped = keep.count(False)
    return rows, skipped, [sum(r) for group in rewards for r in group]


def rows_metrics(rows: Sequence[_Row], skipped: int, shaped: Sequence[float]) -> dict[str, float]:
    """What an iteration's datums and their advantages look like."""
    policy = sum(len(r.policy_P) for r in rows)
    metrics = {
        "train/skipped_groups": float(skipped),
        "train/datums": float(len(rows)),
        "train/policy_tokens": float(policy),
    }
    if shaped:
        metrics["reward/shaped_mean"] = statistics.fmean(shaped)
    if policy:
        metrics["train/advantage_abs_mean"] = float(sum(np.abs(r.advantages_P).sum() for r in rows) / policy)
    return metrics


def build_rows(groups: Sequence[Sequence[Episode]], config: RLTrainConfig) -> tuple[list[_Row], dict[str, float]]:
    """The datums of an iteration's groups, trained together, and what their advantages look like."""
    rows, skipped, shaped = episode_rows(groups, config)
    return rows, rows_metrics(rows, skipped, shaped)


@dataclass
class Pending:
    """A minibatch handed to the learner: its rows, its forward_backward and its optim_step futures."""

    rows: list[_Row]
    fwd: Any  # future of the ForwardBackwardOutput
    opt: Any = None  # future of the OptimStepResponse; None: the substep goes on with another minibatch


def submit_minibatch(training: TrainingClient, rows: Sequence[_Row], config: RLTrainConfig, *, step: bool) -> Pending:
    """Queue ``forward_backward`` on ``rows`` (then ``optim_step`` if ``step``) without waiting."""
    fwd = training.forward_backward([r.datum for r in rows], config.loss_fn, dict(config.loss_fn_config) or None)
    return Pending(list(rows), fwd, training.optim_step(config.adam()) if step else None)


def collect(pending: Sequence[Pending], config: RLTrainConfig) -> dict[str, float]:
    """Wait for ``pending`` and reduce it: each reported metric averaged over the calls reporting it."""
    sums: dict[str, float] = {}
    counts: dict[str, int] = {}
    clipped = 0
    for part in pending:
        out = part.fwd.result()
        step = part.opt.result().metrics if part.opt is not None else {}
        for key, value in {**out.metrics, **step}.items():
            sums[key] = sums.get(key, 0.0) + float(value)
            counts[key] = counts.get(key, 0) + 1
        for row, lp in zip(part.rows, out.loss_fn_outputs, strict=True):
            clipped += _clipped(row, lp["logprobs"].to_numpy(), config)
    metrics = {f"train/{k.removesuffix(':mean')}": v / counts[k] for k, v in sums.items() if k != "loss:sum"}
    for estimator in ("k1", "k3"):  # sampler vs learner on the policy's tokens (the client's own diagnostic)
        if f"train/kl_sample_train_{estimator}" in metrics:
            metrics[f"kl/sample_train_{estimator}"] = metrics.pop(f"train/kl_sample_train_{estimator}")
    policy = sum(len(r.policy_P) for part in pending for r in part.rows)
    metrics.update(
        {
            "train/substeps": float(sum(p.opt is not None for p in pending)),
            "loss/sum": sums["loss:sum"],
            "loss": sums["loss:sum"] / max(policy, 1),
        }
    )
    if config.loss_fn == "ppo":  # the loss's own clip_frac also counts the observation tokens between turns
        metrics["train/clip_frac"] = clipped / max(policy, 1)
    if "train/entropy" in metrics:
        metrics["entropy"] = metrics["train/entropy"]
    return metrics


def train_step(training: TrainingClient, rows: Sequence[_Row], config: RLTrainConfig) -> dict[str, float]:
    """``num_substeps`` optimiser steps over disjoint minibatches: each datum is used exactly once."""
    if not rows:
        return {"train/substeps": 0.0}  # every group skipped or dropped: no step this iteration
    # All queued at once: the client runs them in order.
    return collect(
        [
            submit_minibatch(training, [rows[i] for i in part], config, step=True)
            for part in minibatches(len(rows), config.num_substeps)
        ],
        config,
    )


def _clipped(row: _Row, learner_P: np.ndarray, config: RLTrainConfig) -> int:
    """Policy tokens where PPO's clip is active: the ratio beyond its bound on the advantage's side."""
    bounds = {**THRESHOLDS, **config.loss_fn_config}
    ratio = np.exp(learner_P[row.policy_P] - row.sampler_P)
    high = (row.advantages_P > 0) & (ratio > bounds["clip_high_threshold"])
    low = (row.advantages_P < 0) & (ratio < bounds["clip_low_threshold"])
    return int((high | low).sum())


def check_drops(config: RLTrainConfig, dropped: Sequence[DroppedGroup], it: int) -> None:
    """Stop the run when more than ``max_dropped_fraction`` of iteration ``it``'s ``batch_size``
    groups were dropped, naming the first one's error (the recipe's env workflow stops alike)."""
    if dropped:
        check_dropped(
            len(dropped),
            config.batch_size,
            dropped[0].reason,
            max_fraction=config.max_dropped_fraction,
            where=f"iteration {it}",
            knob="RLTrainConfig.max_dropped_fraction",
        )


def evaluate(
    sampler: SamplingClient,
    factory: EnvFactory,
    tasks: Sequence[Task],
    config: RLTrainConfig,
    notices: DropNotices | None = None,
) -> dict[str, float]:
    """Greedy episodes of ``tasks``, one each: accuracy = mean episode return (a dropped one scores 0,
    and is shown through ``notices``); the env's metrics as ``eval/env/*`` (:func:`eval_env_metrics`)."""
    result = sample_episodes(
        sampler, [factory.group_builder(t, 1) for t in tasks], seed=0, params=config.rollout(greedy=True)
    )
    if notices is not None:
        notices("evaluation", result.dropped)
    returns = [g.total_rewards()[0] for g in result.groups] + [0.0] * len(result.dropped)
    accuracy = statistics.fmean(returns)
    stderr = statistics.pstdev(returns) / math.sqrt(len(returns))  # sqrt(p(1-p)/n) for 0/1 rewards
    metrics = {"eval/accuracy": accuracy, "eval/accuracy_stderr": stderr, "eval/tasks": float(len(returns))}
    return {**metrics, **eval_env_metrics(result.metrics, len(result.dropped))}


# -- checkpoints ----------------------------------------------------------------------------------
def save_checkpoint(training: TrainingClient, log_path: Path, iteration: int) -> str:
    path = training.save_state(f"iter_{iteration:06d}", overwrite=True).result().path
    # a torn last line (a kill mid-append) is cut before this one is written (monitor/jsonl.py)
    JsonlAppender(log_path / CHECKPOINTS, fsync=True).append([{"iteration": iteration, "path": path}])
    return path


def resume(training: TrainingClient, log_path: Path) -> int:
    """Load the last checkpoint listed in ``log_path`` (weights and optimiser) and return its
    iteration (0: none). Metrics logged after it, by the run that died, are dropped."""
    saved = read_jsonl_metrics(log_path / CHECKPOINTS) if (log_path / CHECKPOINTS).exists() else []
    if not saved:
        return 0
    training.load_state_with_optimizer(saved[-1]["path"]).result()
    start = int(saved[-1]["iteration"])
    metrics = log_path / "metrics.jsonl"
    if metrics.exists():
        kept = [row for row in read_jsonl_metrics(metrics, step=True) if row["step"] <= start]
        metrics.write_text("".join(json.dumps(row) + "\n" for row in kept), encoding="utf-8")
    return start


# -- the loop -------------------------------------------------------------------------------------
@dataclass
class TrainResult:
    start_iteration: int  # 0, or the iteration a checkpoint resumed from
    metrics: list[dict[str, float]]  # every logged record of this call, with its "step"

    @property
    def evals(self) -> list[dict[str, float]]:
        """The records holding a held-out evaluation, in order."""
        return [m for m in self.metrics if "eval/accuracy" in m]
