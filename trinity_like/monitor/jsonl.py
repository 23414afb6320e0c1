"""JSON Lines files of a run directory: appended after a torn write, read past a damaged line.

A run appends one JSON object per line to ``metrics.jsonl``, ``evals.jsonl``,
``trained_pairs.jsonl``, ``timeline.jsonl`` (and the JSON-lines buffer). A process killed
mid-write leaves a last line without its newline; a resumed run that appended straight
after it would glue its first record to that fragment, and every reader would lose both.

Writers go through :class:`JsonlAppender`: each append takes an exclusive ``flock`` on the
file (so a second process appending to it -- the split modes' explorer and trainer share
``timeline.jsonl`` -- never sees a line half written), cuts a torn tail left by a writer
that died (a last line without its newline, or one that is not a JSON object), saying so in
one line on stderr, then writes whole lines::

    log = JsonlAppender(run_dir / "timeline.jsonl")
    log.append([{"actor": "trainer", "phase": "update", "step": 3, "start": 1.0, "end": 2.5}])

Readers go through :func:`read_records`: a damaged line (not UTF-8, not JSON, JSON but not
an object, longer than :data:`MAX_LINE_BYTES`, or failing the caller's ``check``) is
skipped and reported with its file and line; a last line without its newline is left for
later (it may still be being written). ``NaN`` / ``Infinity`` and numbers beyond a float's
range read as ``null``::

    got = read_records(run_dir / "metrics.jsonl", check=needs({"step": int}))
    got.records   # [(line number, {...}), ...]
    got.damaged   # ["metrics.jsonl:7: not JSON (Expecting value at column 1)", ...]
"""

from __future__ import annotations

import fcntl
import json
import math
import os
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

MAX_LINE_BYTES = 8 * 2**20  # a longer line is damage, not a record (no writer of ours comes near it)
_BLOCK = 65536
_FLOAT_MAX = 2**1024  # an int at least this large does not fit a float: read as null

Check = Callable[[dict[str, Any]], "str | None"]  # a record -> why it is unusable, or None


def warn(message: str) -> None:
    """One warning line on stderr, in the CLI's ``trinity-like: error:`` shape."""
    sys.stderr.write(f"trinity-like: warning: {message}\n")
    sys.stderr.flush()


# -- appending ------------------------------------------------------------------------------------
def _line_start(fd: int, end: int) -> int:
    """Offset just after the last newline before ``end`` (0 if none), read back a block at a time."""
    pos = end
    while pos > 0:
        start = max(0, pos - _BLOCK)
        cut = os.pread(fd, pos - start, start).rfind(b"\n")
        if cut >= 0:
            return start + cut + 1
        pos = start
    return 0


def _tail_problem(fd: int) -> tuple[int, str] | None:
    """``(offset, why)`` of a last line a writer left unfinished, or None when the file ends cleanly."""
    size = os.fstat(fd).st_size
    if size == 0:
        return None
    complete = os.pread(fd, 1, size - 1) == b"\n"
    end = size - 1 if complete else size
    start = _line_start(fd, end)
    if not complete:
        return start, f"a last line of {size - start} bytes without its newline"
    if end - start > MAX_LINE_BYTES:
        return None  # not a torn write; readers skip it as too long
    text = os.pread(fd, end - start, start)
    if not text.strip():
        return None
    try:
        parsed = json.loads(text)
    except (ValueError, RecursionError):
        return start, "a last line that is not JSON"
    return None if isinstance(parsed, dict) else (start, "a last line that is not a JSON object")


def _newlines_before(fd: int, end: int) -> int:
    count, pos = 0, 0
    while pos < end:
        block = os.pread(fd, min(_BLOCK * 16, end - pos), pos)
        if not block:
            break
        count, pos = count + block.count(b"\n"), pos + len(block)
    return count


def _cut(fd: int, path: Path) -> None:
    problem = _tail_problem(fd)
    if problem is not None:
        start, why = problem
        line = _newlines_before(fd, start) + 1
        os.ftruncate(fd, start)
        warn(f"{path}:{line}: cut {why} (left by a writer that was killed) before appending")


def cut_torn_tail(path: str | os.PathLike) -> None:
    """Cut a torn last line of ``path`` (see :class:`JsonlAppender`), under the appenders' lock."""
    fd = os.open(path, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        _cut(fd, Path(path))
    finally:
        os.close(fd)  # closing drops the lock


class JsonlAppender:
    """Appends JSON records to ``path`` as lines; the file (and its folder) is made at the first append.

    ``keep_open``: hold the file open between appends (one log per step); otherwise it is
    opened for each append. ``fsync``: make each append durable before returning.
    """

    def __init__(self, path: str | os.PathLike, *, keep_open: bool = False, fsync: bool = False) -> None:
        self.path = Path(path)
        self.keep_open, self.fsync = keep_open, fsync
        self._fd: int | None = None

    def _open(self) -> int:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        return os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)

    def open(self) -> JsonlAppender:
        """Create the file now (a held-open log that should exist from its start)."""
        if self._fd is None:
            self._fd = self._open()
        return self

    def append(self, records: Iterable[dict[str, Any]]) -> None:
        # strict JSON: a NaN or an infinity is written as null, as readers would read it
        self.append_lines(json.dumps(_finite(r), allow_nan=False) for r in records)

    def append_lines(self, lines: Iterable[str]) -> None:
        """Append lines the caller encoded (one JSON object each, without its newline) -- a buffer's
        rows, which keep their own codec (:func:`trinity_like.buffer.rows.encode`)."""
        data = "".join(line + "\n" for line in lines).encode("utf-8")
        if not data:
            return
        fd = self._fd if self._fd is not None else self._open()
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            try:
                _cut(fd, self.path)
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view) :]
                if self.fsync:
                    os.fsync(fd)
            finally:
                fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            if self.keep_open:
                self._fd = fd
            elif fd != self._fd:
                os.close(fd)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


# -- reading --------------------------------------------------------------------------------------
def _finite(value: Any) -> Any:
    """``value`` with every NaN, infinity and int beyond a float's range replaced by None."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, int) and not isinstance(value, bool):
        return value if -_FLOAT_MAX < value < _FLOAT_MAX else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value


finite = _finite  # for answers built from records (the view's JSON)


def parse_line(raw: bytes) -> tuple[dict[str, Any] | None, str]:
    """``(record, "")`` of one line, or ``(None, why)`` when it is not a JSON object."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        return None, f"not UTF-8 text ({exc.reason})"
    try:
        record = json.loads(text, parse_constant=lambda name: None)
    except json.JSONDecodeError as exc:
        return None, f"not JSON ({exc.msg} at column {exc.colno})"
    except ValueError:  # Python reads no integer of more than 4300 digits
        return None, "not JSON (a number too long to read)"
    except RecursionError:
        return None, "not JSON (nested too deeply)"
    if not isinstance(record, dict):
        return None, f"a JSON {type(record).__name__}, not an object"
    if _depth(record) > MAX_DEPTH:
        return None, f"nested deeper than {MAX_DEPTH} levels"
    return _finite(record), ""


MAX_DEPTH = 64  # objects and lists inside one another: no record of ours goes past 4


def _depth(value: Any) -> int:
    """How deeply lists and objects nest in ``value`` (iteratively: a hostile line cannot overflow the stack)."""
    deepest, todo = 0, [(value, 1)]
    while todo:
        node, level = todo.pop()
        if isinstance(node, (dict, list)):
            deepest = max(deepest, level)
            if level <= MAX_DEPTH:
                todo.extend((v, level + 1) for v in (node.values() if isinstance(node, dict) else node))
    return deepest


_KINDS = {int: "a whole number", float: "a number", str: "a string", dict: "an object", list: "a list"}


def needs(fields: dict[str, type | tuple[type, ...]]) -> Check:
    """A check that each of ``fields`` is present with one of its types (``float`` takes ints too; a
    boolean is never a number); its answer names the first field that is not."""

    def check(record: dict[str, Any]) -> str | None:
        for name, kinds in fields.items():
            kinds = kinds if isinstance(kinds, tuple) else (kinds,)
            value = record.get(name)
            ok = not isinstance(value, bool) and any(
                isinstance(value, (int, float) if k is float else k) for k in kinds
            )
            if not ok:
                want = " or ".join(_KINDS.get(k, k.__name__) for k in kinds)
                got = "missing" if name not in record else f"got {json.dumps(value)[:40]}"
                return f'field "{name}" must be {want} ({got})'
        return None

    return check


@dataclass
class Read:
    """What :func:`read_records` found from an offset on."""

    name: str  # the file, as messages name it
    records: list[tuple[int, dict[str, Any]]] = field(default_factory=list)  # (line number, record)
    damaged: list[tuple[int, str]] = field(default_factory=list)  # (line number, why), one per skipped line
    end: int = 0  # byte offset after the last complete line read
    next_line: int = 1  # number of the line at ``end``

    def messages(self) -> list[str]:
        """``file:line: why`` of each damaged line."""
        return [f"{self.name}:{line}: {why}: line skipped" for line, why in self.damaged]


def read_records(
    path: str | os.PathLike,
    offset: int = 0,
    line: int = 1,
    *,
    check: Check | None = None,
    max_bytes: int | None = None,
    name: str | None = None,
) -> Read:
    """The records of ``path`` from byte ``offset`` (the start of line ``line``) on.

    A last line without its newline is not read (``end`` stays before it). ``max_bytes``:
    stop after about this many bytes (the next call goes on from ``end``). Damaged lines
    are named ``<name or path>:<line>``.
    """
    out = Read(name or str(path), end=offset, next_line=line)
    with open(path, "rb") as fh:
        if offset >= os.fstat(fh.fileno()).st_size:
            return out  # nothing new (a filesystem may not even seek that far)
        fh.seek(offset)
        while max_bytes is None or out.end - offset < max_bytes:
            raw = fh.readline(MAX_LINE_BYTES + 1)
            if not raw.endswith(b"\n"):
                if len(raw) <= MAX_LINE_BYTES or not _skip_rest_of_line(fh):
                    break  # the end, or a line still being written
                out.damaged.append((out.next_line, f"longer than {MAX_LINE_BYTES // 2**20} MiB"))
            elif raw.strip():
                record, why = parse_line(raw)
                why = why or (check(record) if check is not None else None)
                if why:
                    out.damaged.append((out.next_line, why))
                else:
                    out.records.append((out.next_line, record))
            out.end = fh.tell()
            out.next_line += 1
    return out


def _skip_rest_of_line(fh: Any) -> bool:
    """Read past the rest of an over-long line; False if the file ends before its newline."""
    while True:
        chunk = fh.readline(_BLOCK)
        if not chunk:
            return False
        if chunk.endswith(b"\n"):
            return True


def line_at(path: str | os.PathLike, offset: int) -> int:
    """The number of the line that starts at byte ``offset`` (1 + the newlines before it)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        return _newlines_before(fd, offset) + 1
    finally:
        os.close(fd)


WARNED_PER_FILE = 5  # damaged lines named one by one on stderr; more are counted in one line


def warn_damaged(got: Read) -> None:
    """One stderr line per damaged line of ``got`` (at most :data:`WARNED_PER_FILE`, then how many more)."""
    for message in got.messages()[:WARNED_PER_FILE]:
        warn(message)
    if len(got.damaged) > WARNED_PER_FILE:
        warn(f"{got.name}: {len(got.damaged) - WARNED_PER_FILE} more damaged lines skipped")


def read_file_records(path: str | os.PathLike, check: Check | None = None, name: str | None = None) -> Read:
    """Every record of a whole file, each damaged line named on stderr (:func:`warn_damaged`)."""
    got = read_records(path, check=check, name=name)
    warn_damaged(got)
    return got
