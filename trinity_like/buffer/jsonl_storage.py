"""A JSON Lines buffer: rows appended to a text file a person can read, grep and share.

Each line is one row's ``to_dict()`` (a pair is recognised by its ``chosen_tokens``), so
the file is also the export format of a run's experiences. A reader walks the file in
write order; its position is saved beside the file (``<file>.cursor.json``) at each
``commit``, so claims that were never committed are claimed again after a restart.

Only "fifo" order exists here (a file is read front to back). Rows below the staleness
floor (``min_model_version`` or :meth:`drop_older_than`) are skipped and counted as
dropped when the cursor passes them.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trinity_like.atomic import write_atomic
from trinity_like.buffer.groups import unit_of
from trinity_like.buffer.rows import Row, check_claim_args, check_status, decode, encode, kind_of, model_version
from trinity_like.monitor.jsonl import JsonlAppender
from trinity_like.registry import BUFFER_STORAGE


def _kind(record: dict[str, Any]) -> str:
    return "pair" if "chosen_tokens" in record else "experience"


def _complete_records(path: str | Path) -> Iterator[dict[str, Any]]:
    """Every complete line of the file, decoded (a torn last line is not one)."""
    with open(path, "rb") as f:
        for line in f:
            if line.endswith(b"\n") and line.strip():
                yield json.loads(line)


def read_rows(path: str | Path) -> Iterator[Row]:
    """Every row of a JSONL buffer file, in write order."""
    for record in _complete_records(path):
        yield decode(_kind(record), json.dumps(record))


@dataclass(frozen=True)
class JsonlParams:
    """The file a JSONL buffer appends to and reads from."""

    path: str = "experiences.jsonl"  # a relative path is taken inside the run directory
    poll_interval_s: float = 0.01  # pause of a claim waiting for more lines


@BUFFER_STORAGE.register_module("jsonl")
class JsonlStorage:
    """JSON Lines file: append rows, read them back in order; cursor saved at each commit."""

    def __init__(self, *, params: JsonlParams, run_dir: str | Path | None = None) -> None:
        path = Path(params.path).expanduser()
        if run_dir is not None and not path.is_absolute():
            path = Path(run_dir) / path
        path.parent.mkdir(parents=True, exist_ok=True)
        path.touch()
        self.params = params
        self.path = path
        self._cursor_path = path.with_name(path.name + ".cursor.json")
        self._lock = threading.Lock()
        self._state = {"offset": 0, "step": None, "consumed": 0, "dropped": 0, "floor": None}
        if self._cursor_path.exists():
            self._state.update(json.loads(self._cursor_path.read_text()))
        self._offset = self._state["offset"]  # read position, ahead of the committed one
        self._claimed = 0
        self._dropped_since_commit = 0
        self._writer_done = False
        self._ids: set[str] | None = None  # eids in the file, read at the first put
        self._appender = JsonlAppender(path)

    def put(self, rows: Sequence[Row]) -> None:
        """Append rows as lines; a reader waits for a line until its newline is written.

        A row whose ``eid`` the file holds already is skipped (as SQLite's ``INSERT OR
        IGNORE`` does): a step a resumed run explores again writes its first attempt's ids."""
        for row in rows:
            kind_of(row)
        with self._lock:
            if self._ids is None:  # the ids of the file, read once, at the first put
                self._ids = {record["eid"] for record in _complete_records(self.path)}
            new = []
            for row in rows:
                if row.eid not in self._ids:
                    self._ids.add(row.eid)
                    new.append(row)
            # under the appenders' lock, after cutting a line a killed writer left (which this append
            # would run into); each row in the codec the other storages use, compact JSON
            self._appender.append_lines(encode(row)[1] for row in new)

    def _line_at(self, offset: int) -> tuple[dict[str, Any], int, int] | None:
        """The record of the first complete line at or after ``offset``, with that line's start
        and the offset after it; None at the end (or at a line still being written)."""
        with open(self.path, "rb") as f:
            f.seek(offset)
            while True:
                start = f.tell()
                line = f.readline()
                if not line.endswith(b"\n"):  # end of file, or a line still being written
                    return None
                if line.strip():
                    return json.loads(line), start, f.tell()

    def claim(
        self,
        n: int,
        *,
        order: str = "fifo",
        min_model_version: int | None = None,
        timeout: float | None = None,
    ) -> list[Row]:
        """The next ``n`` rows of the file, whole groups only (waiting for lines as
        :meth:`SqliteStorage.claim` does).

        A group's rows are written one after the other, so the read position moves group by
        group: it stops before a group that does not fit, and waits at one whose last lines
        are not written yet. A group followed by another's line before it is whole was cut
        by a writer that died and never wrote the rest: it is passed over and counted as
        dropped. A group with a row below the staleness floor is dropped whole."""
        check_claim_args(n, order, ("fifo",))
        floors = [f for f in (min_model_version, self._state["floor"]) if f is not None]
        floor = max(floors) if floors else None
        deadline = None if timeout is None else time.monotonic() + timeout
        out: list[Row] = []
        unit: list[Row] = []  # the rows of the group being read, from self._offset on
        key, stale, at = "", False, self._offset
        with self._lock:
            while len(out) < n:
                got = self._line_at(at)
                if got is None:
                    if self._writer_done or (deadline is not None and time.monotonic() >= deadline):
                        break
                    time.sleep(self.params.poll_interval_s)
                    continue
                record, start, at = got
                row = decode(_kind(record), json.dumps(record))
                row_key, size = unit_of(row)
                if unit and row_key != key:  # the group before never got its last rows
                    self._dropped_since_commit += len(unit)
                    unit, stale, self._offset = [], False, start
                key = row_key
                unit.append(row)
                stale = stale or (floor is not None and model_version(row) < floor)
                if len(unit) < size:
                    continue
                if stale:
                    self._dropped_since_commit += size
                elif len(out) + size > n:  # does not fit: the next claim starts with it
                    break
                else:
                    out += unit
                unit, stale, self._offset = [], False, at
        self._claimed += len(out)
        return out

    def drop_older_than(self, model_version: int) -> int:
        """Rows sampled before ``model_version`` will be skipped; returns 0 (counted when passed)."""
        self._state["floor"] = max(model_version, self._state["floor"] or model_version)
        return 0

    def commit(self, step: int) -> None:
        """Save the read position as consumed by ``step`` (idempotent for a repeated step)."""
        last = self._state["step"]
        if last is not None and step <= last:
            if self._claimed:
                raise ValueError(f"commit({step}): step {last} is committed already and rows are claimed")
            return
        self._state.update(
            offset=self._offset,
            step=step,
            consumed=self._state["consumed"] + self._claimed,
            dropped=self._state["dropped"] + self._dropped_since_commit,
        )
        write_atomic(self._cursor_path, json.dumps(self._state))
        self._claimed = self._dropped_since_commit = 0

    def count(self, status: str = "available") -> int:
        """Rows in a state; "available" counts the complete lines after the read position."""
        check_status(status)
        if status == "claimed":
            return self._claimed
        if status in ("consumed", "dropped"):
            return self._state[status]
        with open(self.path, "rb") as f:
            f.seek(self._offset)
            return sum(1 for line in f if line.endswith(b"\n") and line.strip())

    def mark_writer_done(self) -> None:
        """No more lines will come (in this process): a claim at the end of the file returns what it has."""
        self._writer_done = True

    def recover(self, checkpoint_step: int | None = None) -> dict[str, int]:
        """Nothing to move: reading restarts at the cursor saved by the last commit, so
        claims that were never committed are claimed again."""
        return {}

    def close(self) -> None:
        """Nothing held open between calls."""
