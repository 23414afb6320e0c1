"""The fast, non-persistent buffer: a bounded queue in this process or in a Ray actor.

Why bounded: an explorer that outruns the trainer would otherwise fill memory with
experiences that go staler every step. With ``capacity`` rows available, a ``put`` blocks
until the trainer claims some (back-pressure), so the explorer slows down to the
trainer's pace instead of growing the queue without bound.

Nothing survives the process (or the Ray actor): use ``sqlite`` when a run must resume.
Claims and commits follow the same contract as ``sqlite`` so strategies need not care.

Example::

    buf = MemoryStorage(params=MemoryParams(capacity=256))
    buf.put(rows)                      # blocks while 256 rows wait unclaimed
    batch = buf.claim(32, timeout=1.0)
    buf.commit(step=1)
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trinity_like.buffer.base import ORDERS
from trinity_like.buffer.groups import take_whole_groups, unit_of
from trinity_like.buffer.rows import Row, check_claim_args, check_status, decode, encode, model_version
from trinity_like.registry import BUFFER_STORAGE


class BufferFullError(TimeoutError):
    """A put waited ``put_timeout`` seconds on a full queue."""


@dataclass(frozen=True)
class MemoryParams:
    """Capacity and sharing of the in-memory queue."""

    capacity: int = 4096  # most available (unclaimed) rows; a put beyond it blocks
    put_timeout_s: float | None = None  # a put blocked longer raises BufferFullError; None waits forever
    ray_actor: str = ""  # name of a Ray actor holding the queue, shared across processes; "" = in-process


class MemoryQueue:
    """The queue itself: thread-safe, blocking ``put`` when full, blocking ``claim`` when short."""

    def __init__(self, capacity: int, put_timeout_s: float | None = None) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be at least 1, got {capacity}")
        self.capacity = capacity
        self.put_timeout_s = put_timeout_s
        self._cond = threading.Condition()
        self._available: dict[int, Row] = {}  # seq -> row, in write order
        self._claimed: list[Row] = []
        self._counts = {"consumed": 0, "dropped": 0}
        self._seq = itertools.count()
        self._eids: set[str] = set()
        self._writer_done = False
        self.last_step: int | None = None

    def put(self, rows: Sequence[Row]) -> None:
        """Append rows, waiting for room as needed (rows go in as room frees, in order).

        Room is waited for only before a group's first row, for the whole group (a group
        larger than ``capacity`` goes in once the queue is empty): a claim never sees a part
        of a group, and a queue of fewer rows than a group still takes it."""
        deadline = None if self.put_timeout_s is None else time.monotonic() + self.put_timeout_s
        with self._cond:
            self._writer_done = False
            previous = None
            for row in rows:
                if row.eid in self._eids:
                    continue
                key, size = unit_of(row)
                if key != previous:  # a unit begins: room for all of it
                    self._cond.notify_all()  # a claim may take what went in before this wait
                    while self._available and len(self._available) + size > self.capacity:
                        left = None if deadline is None else deadline - time.monotonic()
                        if left is not None and left <= 0:
                            raise BufferFullError(f"buffer full ({self.capacity} rows) for {self.put_timeout_s} s")
                        self._cond.wait(left)
                previous = key
                self._available[next(self._seq)] = row
                self._eids.add(row.eid)
            self._cond.notify_all()

    def mark_writer_done(self) -> None:
        with self._cond:
            self._writer_done = True
            self._cond.notify_all()

    def claim(self, n: int, order: str, min_model_version: int | None, timeout: float | None) -> list[Row]:
        check_claim_args(n, order, ORDERS)
        floor = -(2**62) if min_model_version is None else min_model_version
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while True:
                taken, full = self._pick(n, order, floor)
                left = None if deadline is None else deadline - time.monotonic()
                if full or self._writer_done or (left is not None and left <= 0):
                    break
                self._cond.wait(left)
            for seq, row in taken:
                del self._available[seq]
                self._claimed.append(row)
            self._cond.notify_all()  # room for a blocked writer
            return [row for _, row in taken]

    def _pick(self, n: int, order: str, floor: int) -> tuple[list[tuple[int, Row]], bool]:
        """Up to ``n`` eligible ``(seq, row)`` of whole groups, and whether the claim is full
        (:func:`~trinity_like.buffer.groups.take_whole_groups`); fifo walks only as far as it must."""
        eligible: Any = ((s, r) for s, r in self._available.items() if model_version(r) >= floor)
        if order != "fifo":
            eligible = sorted(eligible, key=lambda sr: (-model_version(sr[1]), sr[0]))
        return take_whole_groups((((s, r), *unit_of(r)) for s, r in eligible), n)

    def drop_older_than(self, version: int) -> int:
        with self._cond:
            # a group goes whole: rows of one group share their version, but should one lag, the
            # rest would wait for it for ever
            stale = {unit_of(r)[0] for r in self._available.values() if model_version(r) < version}
            old = [s for s, r in self._available.items() if unit_of(r)[0] in stale]
            for seq in old:
                del self._available[seq]
            self._counts["dropped"] += len(old)
            self._cond.notify_all()
            return len(old)

    def commit(self, step: int) -> None:
        with self._cond:
            if self.last_step is not None and step <= self.last_step:
                if self._claimed:
                    raise ValueError(f"commit({step}): step {self.last_step} is committed already and rows are claimed")
                return
            self._counts["consumed"] += len(self._claimed)
            self._claimed = []
            self.last_step = step

    def count(self, status: str) -> int:
        check_status(status)
        with self._cond:
            if status == "available":
                return len(self._available)
            if status == "claimed":
                return len(self._claimed)
            return self._counts[status]


class _RayQueue:
    """Forwards calls to a named Ray actor; rows cross as ``(kind, JSON)``, not pickled objects."""

    def __init__(self, name: str, capacity: int, put_timeout_s: float | None) -> None:
        import ray

        actor_cls = ray.remote(num_cpus=0, max_concurrency=64)(_JsonQueue)
        self._ray = ray
        self._actor = actor_cls.options(name=name, get_if_exists=True).remote(capacity, put_timeout_s)

    def _call(self, method: str, *args: Any) -> Any:
        return self._ray.get(getattr(self._actor, method).remote(*args))

    def put(self, rows: Sequence[Row]) -> None:
        self._call("put", [encode(r) for r in rows])

    def claim(self, n: int, order: str, min_model_version: int | None, timeout: float | None) -> list[Row]:
        return [decode(k, t) for k, t in self._call("claim", n, order, min_model_version, timeout)]

    def drop_older_than(self, version: int) -> int:
        return self._call("drop_older_than", version)

    def commit(self, step: int) -> None:
        self._call("commit", step)

    def count(self, status: str) -> int:
        return self._call("count", status)

    def mark_writer_done(self) -> None:
        self._call("mark_writer_done")


class _JsonQueue(MemoryQueue):
    """The actor side of :class:`_RayQueue`: a :class:`MemoryQueue` speaking encoded rows."""

    def put(self, rows: Sequence[tuple[str, str]]) -> None:  # type: ignore[override]
        super().put([decode(k, t) for k, t in rows])

    def claim(self, n: int, order: str, min_model_version: int | None, timeout: float | None) -> list:  # type: ignore[override]
        return [encode(r) for r in super().claim(n, order, min_model_version, timeout)]


@BUFFER_STORAGE.register_module("memory")
class MemoryStorage:
    """In-memory queue (in-process or a Ray actor): fast, bounded, back-pressure, not persistent."""

    def __init__(self, *, params: MemoryParams, run_dir: str | Path | None = None) -> None:
        # run_dir is accepted so every storage is built alike; nothing is written there.
        self.params = params
        if params.ray_actor:
            self._q: Any = _RayQueue(params.ray_actor, params.capacity, params.put_timeout_s)
        else:
            self._q = MemoryQueue(params.capacity, params.put_timeout_s)

    def put(self, rows: Sequence[Row]) -> None:
        """Append rows; blocks while the queue holds ``capacity`` unclaimed rows."""
        self._q.put(list(rows))

    def claim(
        self,
        n: int,
        *,
        order: str = "fifo",
        min_model_version: int | None = None,
        timeout: float | None = None,
    ) -> list[Row]:
        """Claim up to ``n`` rows (see :meth:`SqliteStorage.claim` for the arguments)."""
        return self._q.claim(n, order, min_model_version, timeout)

    def drop_older_than(self, model_version: int) -> int:
        """Drop available rows sampled before ``model_version``; returns how many."""
        return self._q.drop_older_than(model_version)

    def commit(self, step: int) -> None:
        """Mark every claimed row consumed by ``step`` (idempotent for a repeated step)."""
        self._q.commit(step)

    def count(self, status: str = "available") -> int:
        """Rows in a state: "available", "claimed", "consumed", "dropped"."""
        return self._q.count(status)

    def mark_writer_done(self) -> None:
        """No more rows will come: a claim waiting for ``n`` rows returns what there is."""
        self._q.mark_writer_done()

    def recover(self, checkpoint_step: int | None = None) -> dict[str, int]:
        """Nothing survives a restart in memory: nothing to reconcile."""
        return {}

    def close(self) -> None:
        """Nothing to release: the queue lives as long as this object (or the Ray actor)."""
