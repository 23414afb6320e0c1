"""Explorer and trainer as two processes (modes ``explore`` and ``train``) on one run directory.

Start both with the same recipe, in any order, on one machine or two that share the run
directory::

    trinity-like run --config recipe.yaml mode=train
    trinity-like run --config recipe.yaml mode=explore

They meet in two places only:

- the SQLite buffer (``<run_dir>/buffer.sqlite`` by default): the explorer writes each
  step's experiences, the trainer claims a batch and commits it with its checkpoint;
- the weight channel (``<run_dir>/sync``, :mod:`.weight_channel`): the trainer publishes its weights
  every ``synchronizer.interval`` steps (and at the end), the explorer loads the newest.

The explorer keeps the schedule of the one-process loop: the batch for step ``t`` is
sampled by the trainer's weights of step ``t - 1 - synchronizer.offset`` (rounded down to a
published version) or newer, so with the same seed and offset 0 the two processes train
exactly what ``mode: both`` trains. Each process resumes on its own after a kill: the
trainer from its checkpoints, the explorer from ``<run_dir>/explorer/state.json`` (its
task position, written after each batch is in the buffer: a kill between the two writes a
batch twice, never loses one).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from trinity_like.atomic import write_atomic
from trinity_like.monitor.logger import PhaseTimer
from trinity_like.pipeline.verbs import StageVerbs
from trinity_like.pipeline.weight_channel import WeightChannel
from trinity_like.pipeline.weight_ledger import needed_version

WAIT_NOTICE_S = 60.0  # how often a waiting explorer says what it waits for


class ExplorerState:
    """The explorer process's position: last step explored, task order, loaded weight version."""

    def __init__(self, run_dir: Path) -> None:
        self.path = run_dir / "explorer" / "state.json"

    def load(self) -> dict[str, Any] | None:
        return json.loads(self.path.read_text()) if self.path.exists() else None

    def save(self, state: dict[str, Any]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(self.path, json.dumps(state))


class ExplorerProcess:
    """The explorer process's loop over the weight channel and the buffer."""

    def __init__(self, stage: StageVerbs, poll_s: float = 0.2) -> None:
        self.stage = stage
        self.channel = WeightChannel(stage.file(""))
        self.state = ExplorerState(stage.file(""))
        self.version = 0  # the weights the explorer samples with (0: the initial model)
        self.poll_s = poll_s

    def wait_for(self, version: int) -> float:
        """Load the newest published weights once they are at least ``version``; returns the seconds waited."""
        t0 = time.perf_counter()
        notice = t0 + WAIT_NOTICE_S
        while True:
            latest = self.channel.latest()
            if version <= self.version and (latest is None or latest <= self.version):
                return time.perf_counter() - t0
            if latest is not None and latest >= version and latest > self.version:
                try:
                    self.stage.receive_weights(self.channel.folder(latest), latest)
                except FileNotFoundError:  # pruned while we read it: take the newest again
                    continue
                self.version = latest
                return time.perf_counter() - t0
            if time.perf_counter() >= notice:
                self.stage.note(
                    f"waiting for trainer weights v{version} in {self.channel.root} "
                    f"(newest: {'none' if latest is None else f'v{latest}'})"
                )
                notice += WAIT_NOTICE_S
            time.sleep(self.poll_s)

    def evaluate(self, step: int) -> dict[str, float]:
        metrics = self.stage.evaluate(step)
        if metrics:
            self.stage.log(step, {**metrics, "explorer/model_version": float(self.version)})
        return metrics

    def run(self) -> dict[str, float]:
        stage = self.stage
        params = stage.params
        total, offset, interval = params.total_steps, params.sync_offset, params.sync_interval
        start = 0
        saved = self.state.load() if params.resume else None
        if saved is not None:
            start = int(saved["step"])
            stage.restore_task_position(saved["tasks"])
            stage.note(f"explorer resumed after step {start}")
            stage.advance(start)
        elif params.eval_at_start:
            self.evaluate(0)  # nothing without held-out tasks
        last: dict[str, float] = {}
        for step in range(start + 1, total + 1):
            timer = PhaseTimer()
            t0 = time.perf_counter()
            before = self.version
            with timer("wait_weights"), stage.span("explorer", "wait", step):
                self.wait_for(needed_version(step, offset, interval))
            every = params.eval_interval
            if every and self.version // every != before // every and self.version != total:
                with timer("eval"):  # the first version of each eval interval the explorer loads
                    self.evaluate(self.version)
            with timer("rollout"), stage.span("explorer", "rollout", step):
                rows, metrics = stage.explore(step)
            with timer("buffer_write"):
                stage.put(rows, step)
            self.state.save({"step": step, "tasks": stage.task_position(), "version": self.version})
            rewards = [float(r.reward or 0.0) for r in rows]
            metrics.update(timer.metrics())
            metrics.update(
                {
                    "explorer/model_version": float(self.version),
                    "explorer/rows": float(len(rows)),
                    "reward/mean": sum(rewards) / max(len(rewards), 1),
                    "time/step": time.perf_counter() - t0,
                }
            )
            stage.log(step, metrics)
            stage.advance()
            last = metrics
        stage.writer_done()
        if stage.has_eval():
            self.wait_for(total)  # the trainer publishes its final weights
            last.update(self.evaluate(total))
        return last


def run_explore(stage: StageVerbs) -> dict[str, float]:
    """``explore`` mode: roll out and write experiences for a trainer process (see module doc)."""
    return ExplorerProcess(stage).run()
