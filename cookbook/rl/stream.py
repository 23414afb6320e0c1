"""Streaming minibatches and off-by-K sampling for :func:`cookbook.rl.train.train`.

:mod:`.train` holds the readable synchronous loop (sample the whole batch, then train);
this module is what ``RLTrainConfig.num_minibatches > 0`` or ``max_steps_off_policy > 0``
runs instead, in the spirit of tinker-cookbook's ``StreamMinibatchConfig`` and
``AsyncConfig``. It uses only the clients' public calls (``run_requests`` through
:func:`~.core.sample_episodes`, ``forward_backward``, ``optim_step``), so it runs on
the in-process clients and on any backend that answers them.

The batch of iteration ``i`` (``batch_size`` groups) is cut into ``C`` chunks of groups
(``C = num_substeps * num_minibatches``, or 1 without streaming); a chunk is one rollout
call. A dispatcher thread starts chunks in dataset order, each on the newest sampler, on a
pool of threads, under one rule (backpressure)::

    started chunks (minus the dropped ones) < min(iterations trained + K + 1, iterations to run) * C

so with K = 0 the chunks of iteration i start only once the weights of iteration i - 1
are published, and with K >= 1 the samplers run up to K iterations ahead. The learner
takes finished chunks, the earliest in the data first, never waiting for a particular one.
A chunk sampled with the weights of version ``v`` (iterations trained) and taken by
iteration ``i`` is ``(i - 1) - v`` steps off-policy; beyond K (a straggler overtaken by
later chunks) it is dropped with a warning and counted (``async/discarded_stale``), and
the learner waits for another. Each chunk is trained as soon as it is taken: with
streaming its own ``forward_backward`` (its advantages computed over its own groups), an ``optim_step`` after every ``num_minibatches``
of them; without, the iteration's rows are split into ``num_substeps`` minibatches as in
the synchronous loop. Every datum is used exactly once, by one iteration.

Sampling seeds: chunk ``c`` of iteration ``i``'s tasks draws from ``sample_seed(seed, i, c)``;
with one chunk that is the synchronous loop's seed, so iteration 1 samples what it samples.

Metrics: ``async/staleness_mean|max`` over the iteration's episodes, ``async/discarded_stale``
(groups dropped), ``async/overlap_fraction`` = 1 - (time the learner waited for samples) /
(wall time its chunks were being sampled): the share of sampling time hidden behind
training (0 in the synchronous loop). ``time/rollout`` is that wait.

Example::

    config = RLTrainConfig(log_path="runs/k1", max_steps_off_policy=1, loss_fn="ppo")
    train(config, training, factory, train_tasks)
"""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

from cookbook.rl.core import (
    Episode,
    Pending,
    RLTrainConfig,
    build_rows,
    check_drops,
    collect,
    episode_rows,
    group_episodes,
    minibatches,
    reference_kl,
    rows_metrics,
    sample_episodes,
    submit_minibatch,
    train_step,
)
from trinity_like.client.sampling import SamplingClient
from trinity_like.client.training import TrainingClient
from trinity_like.envs.dataset import TaskEnvDataset
from trinity_like.envs.guard import DropNotices, DroppedGroup
from trinity_like.envs.types import EnvGroupBuilder
from trinity_like.explorer.engine import sample_seed
from trinity_like.monitor.logger import PhaseTimer


@dataclass
class Chunk:
    """One rollout call's groups, sampled with the weights of ``version``."""

    position: int  # chunks started before it: its place in the data
    iteration: int  # the iteration whose tasks it holds (1-based, as the synchronous loop numbers them)
    index: int  # its position among that batch's chunks
    version: int  # iterations trained when its sampler was taken
    groups: list[list[Episode]]
    dropped: list[DroppedGroup]  # the rollout's groups whose env failed
    metrics: dict[str, float]  # the rollout's, and the reference pass's when there is one
    policy_tokens: int  # sampled tokens (the reference metrics' weight)
    started: float  # perf_counter when sampling began
    finished: float  # ... and ended (reference pass included)


def interval_union(intervals: Sequence[tuple[float, float]]) -> float:
    """Total length covered by ``intervals``.

    >>> interval_union([(0.0, 2.0), (1.0, 3.0), (5.0, 6.0)])
    4.0
    """
    total, end = 0.0, float("-inf")
    for a, b in sorted(intervals):
        if b > end:
            total += b - max(a, end)
            end = b
    return total


def overlap_fraction(sampling_s: float, waited_s: float) -> float:
    """The share of ``sampling_s`` the learner did not wait through, in [0, 1].

    >>> overlap_fraction(4.0, 1.0), overlap_fraction(4.0, 5.0), overlap_fraction(0.0, 0.0)
    (0.75, 0.0, 0.0)
    """
    if sampling_s <= 0:
        return 0.0
    return min(1.0, max(0.0, 1.0 - waited_s / sampling_s))


class ChunkStream:
    """Chunks sampled ahead on a thread pool, under the backpressure rule of the module docstring."""

    def __init__(
        self,
        config: RLTrainConfig,
        dataset: TaskEnvDataset,
        sampler: SamplingClient,
        *,
        start: int,
        reference: SamplingClient | None,
    ) -> None:
        self._config, self._dataset, self._reference = config, dataset, reference
        self._chunks = config.chunks_per_iteration
        self._slices = minibatches(config.batch_size, self._chunks)
        self._start = start
        self._sampler, self._version = sampler, start
        self._started = 0  # chunks started, dropped ones subtracted
        self._next = 0  # chunks started in all: the next one's position in the data
        self._done: list[tuple[int, Future]] = []  # finished and not yet taken, with their positions
        self._closed = False
        self._cond = threading.Condition()
        self._pool = ThreadPoolExecutor(
            (config.max_steps_off_policy + 1) * self._chunks, thread_name_prefix="rl-sampling"
        )
        self._dispatcher = threading.Thread(target=self._dispatch, name="rl-dispatch", daemon=True)
        self._dispatcher.start()

    # -- the learner's side ------------------------------------------------------------------------
    def publish(self, sampler: SamplingClient, version: int) -> None:
        """New weights (``version`` iterations trained): later chunks sample from them."""
        with self._cond:
            self._sampler, self._version = sampler, version
            self._cond.notify_all()

    def take(self) -> Chunk:
        """Of the finished chunks not yet taken, the earliest in the data (blocks until one is
        finished: a straggler never holds up the others); a chunk's rollout error is raised here."""
        with self._cond:
            while not self._done:
                self._cond.wait()
            first = min(range(len(self._done)), key=lambda i: self._done[i][0])
            _, future = self._done.pop(first)
        return future.result()

    def drop(self) -> None:
        """A taken chunk is not trained on: another may start in its place."""
        with self._cond:
            self._started -= 1
            self._cond.notify_all()

    def close(self) -> None:
        """Start nothing more; wait for the rollouts under way (an env step cannot be interrupted)."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._dispatcher.join()
        self._pool.shutdown(wait=True, cancel_futures=True)

    # -- the samplers' side ------------------------------------------------------------------------
    def _dispatch(self) -> None:
        ahead = self._config.max_steps_off_policy + 1
        needed = (self._config.iterations - self._start) * self._chunks  # nothing is sampled for after the run
        while True:
            with self._cond:
                while not self._closed and self._started >= min(
                    (self._version - self._start + ahead) * self._chunks, needed
                ):
                    self._cond.wait()
                if self._closed:
                    return
                n, self._next, self._started = self._next, self._next + 1, self._started + 1
                sampler, version = self._sampler, self._version
            iteration, index = self._start + 1 + n // self._chunks, n % self._chunks
            part = self._slices[index]
            try:  # the builders are made here, one at a time: an env factory need not be thread-safe
                builders = self._dataset.get_batch((iteration - 1) % len(self._dataset))[part.start : part.stop]
            except BaseException as exc:  # noqa: BLE001 -- handed to the learner, whose take() raises it
                failed: Future = Future()
                failed.set_exception(exc)
                self._finished(n, failed)
                return
            future = self._pool.submit(self._sample, n, iteration, index, builders, sampler, version)
            future.add_done_callback(lambda f, n=n: self._finished(n, f))

    def _finished(self, n: int, future: Future) -> None:
        with self._cond:
            self._done.append((n, future))
            self._cond.notify_all()

    def _sample(
        self, n: int, iteration: int, index: int, builders: list[EnvGroupBuilder], sampler: SamplingClient, version: int
    ) -> Chunk:
        started = time.perf_counter()
        rollout = sample_episodes(
            sampler, builders, seed=sample_seed(self._config.seed, iteration, index), params=self._config.rollout()
        )
        groups = [group_episodes(g, version) for g in rollout.groups]
        metrics = dict(rollout.metrics)
        if self._reference is not None:
            metrics.update(reference_kl(self._reference, [ep for g in groups for ep in g]))
        tokens = sum(end - start for g in groups for ep in g for start, end in ep.spans)
        return Chunk(
            n, iteration, index, version, groups, rollout.dropped, metrics, tokens, started, time.perf_counter()
        )


# -- one iteration on the stream ------------------------------------------------------------------------
def stream_iteration(
    stream: ChunkStream,
    training: TrainingClient,
    config: RLTrainConfig,
    it: int,
    timer: PhaseTimer,
    warn: Callable[[str], None],
    notices: DropNotices | None = None,
) -> tuple[list[list[Episode]], dict[str, float]]:
    """Take iteration ``it``'s chunks from ``stream`` and train on them; its groups and metrics.

    Groups whose env failed are shown through ``notices`` and counted; once more than
    ``max_dropped_fraction`` of the iteration's groups are, the run stops (:func:`~.core.check_drops`)."""
    used: list[Chunk] = []
    dropped: list[DroppedGroup] = []
    pending: list[Pending] = []
    streamed: tuple[list, int, list[float]] = ([], 0, [])  # rows, skipped groups, shaped returns so far
    discarded = 0
    waited = 0.0
    with timer("update"):  # learner time; the waits for samples are taken out below into time/rollout
        while len(used) < config.chunks_per_iteration:
            t0 = time.perf_counter()
            chunk = stream.take()
            waited += time.perf_counter() - t0
            staleness = it - 1 - chunk.version
            if staleness > config.max_steps_off_policy:
                stream.drop()
                discarded += len(chunk.groups)
                warn(
                    f"iteration {it}: dropped {len(chunk.groups)} groups sampled with the weights of iteration "
                    f"{chunk.version}, {staleness} steps old (max_steps_off_policy={config.max_steps_off_policy})"
                )
                continue
            used.append(chunk)
            if notices is not None:
                notices(f"iteration {it}", chunk.dropped)
            dropped += chunk.dropped
            check_drops(config, dropped, it)  # as soon as more than the limit is certain
            if config.num_minibatches:  # streaming: train this minibatch now (its advantages: its own groups')
                rows, skipped, shaped = episode_rows(chunk.groups, config)
                streamed = (streamed[0] + rows, streamed[1] + skipped, streamed[2] + shaped)
                step = len(used) % config.num_minibatches == 0
                if rows:
                    pending.append(submit_minibatch(training, rows, config, step=step))
                elif step and pending and pending[-1].opt is None:  # an empty last minibatch ends its substep
                    pending[-1].opt = training.optim_step(config.adam())
        groups = [g for chunk in used for g in chunk.groups]
        if config.num_minibatches:  # the metrics of what was trained, minibatch by minibatch
            metrics = rows_metrics(*streamed)
            metrics.update(collect(pending, config) if pending else {"train/substeps": 0.0})
        else:
            rows, metrics = build_rows(groups, config)
            metrics.update(train_step(training, rows, config))
    timer.times["update"] -= waited
    timer.times["rollout"] = timer.times.get("rollout", 0.0) + waited
    metrics.update(_rollout_metrics(used))
    returns = [sum(ep.rewards) for g in groups for ep in g]
    if returns:  # exact over the iteration, not a mean of the chunks' deviations
        metrics["reward/mean"], metrics["reward/std"] = statistics.fmean(returns), statistics.pstdev(returns)
    sampling_s = interval_union([(c.started, c.finished) for c in used])
    episodes = [ep for g in groups for ep in g]
    staleness = [it - 1 - ep.version for ep in episodes] or [0]
    metrics.update(
        {
            "async/staleness_mean": statistics.fmean(staleness),
            "async/staleness_max": float(max(staleness)),
            "async/discarded_stale": float(discarded),
            "async/sampling_s": sampling_s,
            "async/overlap_fraction": overlap_fraction(sampling_s, waited),
        }
    )
    return groups, metrics


def _rollout_metrics(chunks: Sequence[Chunk]) -> dict[str, float]:
    """The chunks' rollout metrics as one rollout's: counts summed, maxima maximised, means weighted
    by episodes (the reference's per-token KL means by sampled tokens; ``tag/*`` means are
    approximate when chunks hold different shares of a tag)."""
    out: dict[str, float] = {}
    weights: dict[str, float] = {}
    for chunk in chunks:
        episodes = chunk.metrics.get("rollout/episodes", 0.0)
        for key, value in chunk.metrics.items():
            if key in _COUNTS:
                out[key] = out.get(key, 0.0) + value
            elif key.endswith("/max"):
                out[key] = max(out.get(key, value), value)
            else:
                w = float(chunk.policy_tokens) if key.startswith("kl/") else episodes
                out[key] = out.get(key, 0.0) + w * value
                weights[key] = weights.get(key, 0.0) + w
    for key, w in weights.items():
        out[key] = out[key] / w if w else 0.0
    return out


_COUNTS = frozenset(
    {
        "rollout/groups",
        "rollout/dropped_groups",
        "rollout/episodes",
        "rollout/dropped_episodes",
        "rollout/env_errors",
        "rollout/env_retries",
        "rollout/step_timeouts",
        "rollout/engine_calls",
    }
)
