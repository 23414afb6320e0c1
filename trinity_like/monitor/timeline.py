"""When each actor of a run was busy: ``<run_dir>/timeline.jsonl``, one line per span.

A span is one phase of one actor (``explorer`` rollout, ``trainer`` update, ``sync``,
``checkpoint``, a ``wait``...) with its wall-clock start and end (seconds since the epoch,
so spans from the driver, its explorer thread and an explorer actor on the same machine
line up)::

    timeline = Timeline(run_dir / "timeline.jsonl")
    with timeline.span("trainer", "update", step=3):
        ...
    spans = read_spans(run_dir / "timeline.jsonl")
    overlap_fraction(spans)   # share of the explorer's rollout time the trainer was busy too

Each span is appended and flushed as one line when it ends, under a lock (the explorer
thread writes beside the driver; another process on the same run directory takes the
file's ``flock``): a kill loses at most the spans still open, and the line it cut short is
cut before the next append (:class:`~trinity_like.monitor.jsonl.JsonlAppender`). A resumed
run appends to the same file; its spans come after the killed run's. :func:`read_spans`
skips a damaged line with a warning naming it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from trinity_like.monitor.jsonl import JsonlAppender, needs, read_file_records

TIMELINE_FILE = "timeline.jsonl"
IDLE_PHASES = frozenset({"wait"})  # phases in which an actor waits on another: not busy


@dataclass(frozen=True)
class Span:
    actor: str  # "explorer", "trainer", ...
    phase: str  # "rollout", "update", "sync", "checkpoint", "wait", ...
    step: int  # the trainer step (trainer) or the batch's step (explorer)
    start: float  # seconds since the epoch
    end: float

    @property
    def busy(self) -> bool:
        return self.phase not in IDLE_PHASES


class Timeline:
    """Appends spans to ``path`` (created with its folder on the first span)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        self._log = JsonlAppender(self.path)

    def add(self, span: Span) -> None:
        record = {
            "actor": span.actor,
            "phase": span.phase,
            "step": span.step,
            "start": round(span.start, 4),
            "end": round(span.end, 4),
        }
        with self._lock:
            self._log.append([record])

    @contextmanager
    def span(self, actor: str, phase: str, step: int) -> Iterator[None]:
        """Record the time the body takes (also when it raises: the time was spent)."""
        start = time.time()
        try:
            yield
        finally:
            self.add(Span(actor, phase, int(step), start, time.time()))


SPAN_ROW = needs({"actor": str, "phase": str, "step": int, "start": float, "end": float})


def read_spans(path: str | Path) -> list[Span]:
    """The spans of a timeline file, in the order they ended; a torn last line is skipped, and so is
    a damaged line, with a warning naming its file and line (on stderr)."""
    got = read_file_records(path, SPAN_ROW)
    return [Span(r["actor"], r["phase"], r["step"], float(r["start"]), float(r["end"])) for _, r in got.records]


def _merged(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[tuple[float, float]] = []
    for a, b in sorted(intervals):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def overlap_fraction(
    spans: list[Span], hidden: str = "explorer", behind: str = "trainer", phase: str = "rollout"
) -> float | None:
    """The fraction of ``hidden``'s ``phase`` time during which ``behind`` was busy: the
    rollout time hidden behind training. None when there is no such time.

    >>> s = [Span("explorer", "rollout", 2, 0.0, 4.0), Span("trainer", "update", 1, 1.0, 2.0),
    ...      Span("trainer", "wait", 1, 2.0, 4.0)]
    >>> overlap_fraction(s)
    0.25
    """
    work = _merged([(s.start, s.end) for s in spans if s.actor == hidden and s.phase == phase])
    total = sum(b - a for a, b in work)
    if total <= 0:
        return None
    busy = _merged([(s.start, s.end) for s in spans if s.actor == behind and s.busy])
    shared = 0.0
    for a, b in work:
        for c, d in busy:
            shared += max(0.0, min(b, d) - max(a, c))
    return shared / total


def busy_seconds(spans: list[Span], actor: str, phase: str | None = None) -> float:
    """Seconds ``actor`` was busy (in ``phase`` only, when given), overlapping spans counted once."""
    chosen = [(s.start, s.end) for s in spans if s.actor == actor and s.busy and (phase is None or s.phase == phase)]
    return sum(b - a for a, b in _merged(chosen))
