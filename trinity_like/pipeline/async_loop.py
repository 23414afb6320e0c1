"""Mode ``both`` with ``synchronizer.offset >= 1``: the explorer explores while the trainer trains.

The schedule is the reference loop's (:func:`.rl_loop.run_online`), run by two threads of
the driver instead of one::

    explorer thread                              driver (trainer)
    batch s: weights >= version needed(s)        step t: batches up to t into the buffer
             draw tasks, explore  ──rows──►              learn (sample, advantages, update)
             (waits while needed(s) is not               every `interval` steps: publish a
              published: the staleness bound)            snapshot of the weights as version t

``needed(s) = (s - 1 - offset) // interval * interval`` (:func:`.weight_ledger.needed_version`):
batch ``s`` may be sampled by weights at most ``offset`` (+ ``interval - 1``) steps older
than the trainer's when it trains on it. ``synchronizer.sync_style`` picks which published
version the explorer loads before a batch:

- ``fixed``: the oldest at least ``needed(s)`` -- exactly that version, as in the reference
  loop: the same seed gives the same batches and the same per-step rewards, in turn or not;
- ``explorer_driven``: the newest -- whatever the trainer has published when the explorer
  finishes its previous batch (less stale when the explorer is the slower of the two).

What overlaps with what: an explorer in this process (``explorer.placement: local``) runs its
rollout engine in the explorer thread; torch releases the GIL inside its kernels, so its
forward passes run beside the trainer's on the same cores (on a 2-core machine they share
them). An explorer actor (``placement: ray``, or beside verl's workers) runs in its own
process; the explorer thread only waits on it.

One GPU: the explorer thread's CUDA graph captures and the trainer's steps (and weight
exports, and the memory handed over around a rollout) take turns on
:data:`~trinity_like.models.device.DEVICE_TURN`: PyTorch forbids another thread to allocate,
sync or empty the cache while one captures. Only captures wait (once per step shape); the
rollout's replays run beside the trainer.

Weights: the trainer changes its weights in place in every optimiser step, so the explorer
never samples from them. A publish is a snapshot in a shared-memory mailbox of its own
(:class:`Snapshots`): the engine writes it there (verl's rank 0 from its own process, never
through the driver), and the explorer samples from the file where it lies, in this process
or in an actor -- one copy per publish, as a sync in turn makes. A mailbox is written again
only once no later batch may load its version and the explorer has moved past it.

Exactly once: only the driver writes the buffer and draws nothing; the explorer thread
draws tasks. A checkpoint (and an evaluation) first pauses the explorer at a batch
boundary and puts every finished batch into the buffer, so the task position saved with
the checkpoint matches the rows in the buffer, and the next batch's step is saved with it
(``explorer_next_step``, in the loop's own state: :class:`.steps.LoopState`). A run
killed anywhere resumes from its checkpoint like the reference loop: rows not yet committed
come back, batches not yet in the buffer are explored again. After a resume only the
checkpoint's weights exist, so ``fixed`` samples the first batches with them (newer than
``needed``: staleness stays within the bound).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from contextlib import AbstractContextManager, ExitStack
from dataclasses import dataclass
from typing import Any

from trinity_like.errors import TrinityError, WorkerDiedError
from trinity_like.experience import Experience
from trinity_like.models.device import DEVICE_TURN
from trinity_like.monitor.timeline import Span
from trinity_like.pipeline.rl_loop import begin, finish, step
from trinity_like.pipeline.steps import LoopState, StepHooks, StepRecord
from trinity_like.pipeline.verbs import StageVerbs
from trinity_like.pipeline.weight_ledger import needed_version
from trinity_like.trainer.shared_weights import SharedWeights, WeightMailbox

NEXT_STEP_KEY = "explorer_next_step"  # the loop's checkpoint state: the step of the first batch not in the buffer


@dataclass(frozen=True)
class Explored:
    """One batch the explorer thread finished."""

    step: int  # the batch's step (its sampling seed, and the trainer step it is meant for)
    rows: list[Experience]
    metrics: dict[str, float]
    seconds: float  # the explorer's time on it
    version: int  # the weights that sampled it


class Snapshots:
    """Shared-memory mailboxes (:mod:`~trinity_like.trainer.shared_weights`) that hold the
    published versions, reused once their version is let go: as many as versions are held at
    once (``offset`` + 2 with ``fixed``), each written in place after its first use -- no
    fresh 0.5 GB for SmolLM2 at every step. Not thread-safe: :class:`BackgroundExplorer`
    calls it under its lock."""

    def __init__(self) -> None:
        self._free: list[WeightMailbox] = []
        self._held: dict[str, WeightMailbox] = {}  # path -> a mailbox whose version is held
        self._all: list[WeightMailbox] = []

    def spare(self) -> WeightMailbox:
        """A mailbox nobody reads: to write the next version into, then :meth:`hold`."""
        if not self._free:
            self._all.append(WeightMailbox())
            self._free.append(self._all[-1])
        return self._free.pop()

    def hold(self, box: WeightMailbox) -> None:
        self._held[box.path] = box

    def keep_only(self, handles: list[SharedWeights | None]) -> None:
        """Every held mailbox but those of ``handles`` may be written again."""
        keep = {h.path for h in handles if h is not None}
        for path in [p for p in self._held if p not in keep]:
            self._free.append(self._held.pop(path))

    def close(self) -> None:
        for box in self._all:
            box.close()


class BackgroundExplorer:
    """The explorer thread and what it shares with the driver, under one condition variable."""

    def __init__(self, stage: StageVerbs, first_step: int, version: int) -> None:
        """Explore from batch ``first_step`` on, with the explorer holding the weights of ``version``."""
        params = stage.params
        self.stage = stage
        self.total = params.total_steps
        self.offset, self.interval = params.sync_offset, params.sync_interval
        self.newest_first = params.sync_newest_first
        self.next_step = first_step  # the next batch the thread explores
        self.version = version  # the weights the explorer holds now
        self._published: dict[int, SharedWeights] = {}  # snapshots some later batch may load
        self._snapshots = Snapshots()
        self._holds: SharedWeights | None = None  # the snapshot the explorer samples with (None: not one of ours)
        self._loading: SharedWeights | None = None  # the one it loads now
        self._done: deque[Explored] = deque()  # finished, not yet in the buffer
        self._cond = threading.Condition()
        self._paused = self._busy = self._stop = False
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._loop, name="trinity-like-explorer", daemon=True)
        self._thread.start()

    # -- the driver's side ---------------------------------------------------------------
    def publish(self, version: int) -> None:
        """The trainer's weights now, as ``version``, for batches that may use them."""
        with self._cond:
            box = self._snapshots.spare()
        with DEVICE_TURN:  # outside the condition: the explorer goes on meanwhile (but captures no graph)
            weights = self.stage.learner().actor.export_weights(box)
        self.stage.name_weights(version, weights)
        with self._cond:
            self._snapshots.hold(box)
            self._published[version] = weights
            self._prune()
            self._cond.notify_all()

    def take(self) -> Explored:
        """The oldest finished batch, waiting for it if need be."""
        with self._cond:
            while not self._done:
                self._raise_if_failed()
                if self.next_step > self.total:
                    raise TrinityError(f"the trainer wants a batch after step {self.total}'s; the explorer has none")
                self._cond.wait()
            return self._done.popleft()

    def pause(self) -> list[Explored]:
        """Stop the thread at its next batch boundary; returns the batches finished meanwhile."""
        with self._cond:
            self._paused = True
            while self._busy:
                self._cond.wait()
            self._raise_if_failed()
            done, self._done = list(self._done), deque()
            return done

    def resume(self) -> None:
        with self._cond:
            self._paused = False
            self._cond.notify_all()

    def load_newest(self) -> None:
        """While paused: give the explorer the newest published weights (before an evaluation)."""
        with self._cond:
            assert self._paused and not self._busy, "load_newest while the explorer thread runs"
            if self._published:
                newest = max(self._published)
                if newest > self.version:
                    self.stage.receive_weights(self._published[newest], newest)
                    self.version, self._holds = newest, self._published[newest]
                    self._prune()

    def close(self, wait: bool = True) -> None:
        """End the thread (after its batch, when ``wait``; an error path does not wait for it)."""
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        if wait:
            self._thread.join()

    def remove_snapshots(self) -> None:
        """Remove the snapshots' files (a reader that mapped one keeps its pages until it lets them go)."""
        self._snapshots.close()

    def _raise_if_failed(self) -> None:
        if self._error is not None:
            raise self._error

    # -- the explorer thread ---------------------------------------------------------------
    def _choice(self) -> int | None:
        """The version to sample the next batch with, None while none may (see the module doc)."""
        needed = needed_version(self.next_step, self.offset, self.interval)
        usable = [v for v in (*self._published, self.version) if v >= needed]
        if not usable:
            return None
        return max(usable) if self.newest_first else min(usable)

    def _prune(self) -> None:
        """Drop snapshots no later batch will load (``fixed``: older than the next batch needs;
        ``explorer_driven``: all but the newest); their mailboxes are reused once the
        explorer does not sample with them either."""
        needed = needed_version(self.next_step, self.offset, self.interval)
        keep = {max(self._published)} if self.newest_first and self._published else set()
        for v in list(self._published):
            if v not in keep and (self.newest_first or v < needed):
                del self._published[v]
        self._snapshots.keep_only([*self._published.values(), self._holds, self._loading])

    def _loop(self) -> None:
        try:
            while True:
                waited = time.time()
                with self._cond:
                    while not self._stop and self.next_step <= self.total and (self._paused or self._choice() is None):
                        self._cond.wait()
                    if self._stop or self.next_step > self.total:
                        return
                    step, version = self.next_step, self._choice()
                    weights = self._published.get(version)
                    self._loading = weights if version != self.version else None
                    self._busy = True
                try:
                    if time.time() - waited > 1e-3:
                        self.stage.add_span(Span("explorer", "wait", step, waited, time.time()))
                    self._explore(step, version, weights)
                finally:
                    with self._cond:
                        self._busy = False
                        self._cond.notify_all()
        except BaseException as exc:  # noqa: BLE001 -- handed to the driver, which raises it
            with self._cond:
                self._error = exc
                self._cond.notify_all()

    def _explore(self, step: int, version: int, weights: SharedWeights | None) -> None:
        stage = self.stage
        if version != self.version:
            with stage.span("explorer", "sync", step):
                stage.receive_weights(weights, version)
            with self._cond:
                self.version, self._holds, self._loading = version, weights, None
                self._prune()
        t0 = time.perf_counter()
        with stage.span("explorer", "rollout", step):
            rows, metrics = stage.explore(step)  # this thread alone draws tasks: exactly once
        seconds = time.perf_counter() - t0
        with self._cond:
            self._done.append(Explored(step, rows, metrics, seconds, version))
            self.next_step += 1
            self._prune()
            self._cond.notify_all()


class Concurrent(StepHooks):
    """The concurrent loop's step: its batch comes from the explorer thread, the update holds the
    device (:data:`~trinity_like.models.device.DEVICE_TURN`: the thread captures its CUDA graphs
    between steps, never during one) and marks the trainer busy on the CPU board, a sync
    publishes a snapshot, and an evaluation or a checkpoint first pauses the thread."""

    def __init__(self, explorer: BackgroundExplorer, loop: LoopState) -> None:
        self.explorer, self.loop = explorer, loop
        self.pending: dict[str, float] = {}  # metrics of batches put into the buffer outside a step's wait

    def put(self, stage: StageVerbs, loop: LoopState, batches: list[Explored], metrics: dict[str, float]) -> None:
        for b in batches:
            with stage.span("trainer", "buffer_write", b.step):
                stage.put(b.rows, b.step)
            loop.explored = b.step
            metrics.update(b.metrics)
            metrics["explorer/rollout_s"] = metrics.get("explorer/rollout_s", 0.0) + b.seconds
            metrics["explorer/model_version"] = float(b.version)

    def feed(self, stage: StageVerbs, loop: LoopState, rec: StepRecord) -> None:
        rec.metrics.update(self.pending)
        self.pending = {}
        with rec.timer("rollout"):  # what the trainer waits for the explorer, not the explorer's time
            while loop.explored < rec.step:
                with stage.span("trainer", "wait", rec.step):
                    batch = self.explorer.take()
                self.put(stage, loop, [batch], rec.metrics)

    def training(self, stage: StageVerbs) -> AbstractContextManager[Any]:
        both = ExitStack()
        both.enter_context(stage.trainer_computing())
        both.enter_context(DEVICE_TURN)
        return both

    def sync(self, stage: StageVerbs, version: int) -> dict[str, float]:
        self.explorer.publish(version)
        return {}

    def evaluate(self, stage: StageVerbs, step: int) -> dict[str, float]:
        self.put(stage, self.loop, self.explorer.pause(), self.pending)
        try:
            self.explorer.load_newest()
            return stage.evaluate(step)
        finally:
            self.explorer.resume()

    def before_checkpoint(self, stage: StageVerbs, loop: LoopState, step: int) -> None:
        """Every batch the explorer drew is in the buffer before the checkpoint."""
        self.put(stage, loop, self.explorer.pause(), self.pending)
        loop.extra[NEXT_STEP_KEY] = self.explorer.next_step


def run_concurrent(stage: StageVerbs) -> dict[str, float]:
    """Mode ``both``, ``synchronizer.offset >= 1``, ``synchronizer.concurrent``: see the module doc.
    The start, each :func:`.rl_loop.step` and the end are the reference loop's; what differs is
    who explores when (:class:`Concurrent`)."""
    total = stage.params.total_steps
    loop = begin(stage)
    first = int(loop.extra.get(NEXT_STEP_KEY, loop.step + 1))
    loop.explored = first - 1  # the last batch's step that is in the buffer
    explorer = BackgroundExplorer(stage, first, loop.model_version)
    hooks = Concurrent(explorer, loop)
    last: dict[str, float] = {}
    try:
        while loop.step < total:
            last = step(stage, loop, hooks)
            explorer.resume()
        explorer.pause()
        explorer.load_newest()
        explorer.close()
        finish(stage, last)
    except BaseException as exc:
        # A worker's death is restarted in this process (:mod:`.restart`), which closes the
        # explorer next: the thread first ends its batch. Any other error ends the run at once.
        explorer.close(wait=isinstance(exc, WorkerDiedError))
        raise
    finally:
        explorer.remove_snapshots()  # the explorer is not used again but to close it
    return last
