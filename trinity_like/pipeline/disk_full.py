"""A full disk while a run writes: one line naming what could not be written, nothing half-written.

A run writes three things that matter for resuming: checkpoints, the buffer and the
``latest`` pointer. When the disk fills during one of them the run stops with a
:class:`DiskFullError` (one line: what, which file, what is intact, what to do) instead
of a traceback from deep inside a writer, after undoing the partial write:

- a checkpoint's temporary folder is removed (it frees the space it took); ``latest``
  still names the previous checkpoint, which is whole;
- a buffer write is one SQLite transaction, rolled back by SQLite itself.

Free space, run the same command: it resumes from the previous checkpoint and the buffer
gives back what later steps had claimed, so every step's batch is trained once
(``tests/faults/test_disk_full.py``)::

    with disk_full_as_error("step 3's rollouts into the buffer", "the buffer and checkpoint step_000002 are intact"):
        storage.put(rows)

Recognised: ``OSError`` with ENOSPC or EDQUOT (what ``write(2)`` gives on a full disk or
quota) anywhere in the exception's chain, and SQLite's SQLITE_FULL ("database or disk is
full"). A library that reports a failed write without its errno (torch's zip writer:
"file write failed") is not recognised and keeps its traceback.
"""

from __future__ import annotations

import errno
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager

from trinity_like.errors import TrinityError

FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})
SQLITE_FULL = 13  # https://sqlite.org/rescode.html#full


class DiskFullError(TrinityError):
    """The disk (or quota) filled while the run wrote something it needs to resume."""


def disk_full_cause(exc: BaseException) -> BaseException | None:
    """The full-disk error in ``exc``'s chain (itself, its cause or context), or None."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, OSError) and exc.errno in FULL_ERRNOS:
            return exc
        if isinstance(exc, sqlite3.OperationalError) and (exc.sqlite_errorcode & 0xFF) == SQLITE_FULL:
            return exc
        exc = exc.__cause__ or exc.__context__
    return None


def describe(exc: BaseException) -> str:
    """``<file>: No space left on device`` for an OSError; SQLite's own words otherwise."""
    if isinstance(exc, OSError):
        return f"{exc.filename}: {exc.strerror}" if exc.filename else str(exc.strerror or exc)
    return str(exc)


@contextmanager
def disk_full_as_error(what: str, intact: str) -> Iterator[None]:
    """Turn a full disk inside the block into :class:`DiskFullError`: "disk full: could not
    write <what> (<file>: No space left on device); <intact>: free space and run the same
    command". Any other error passes through unchanged."""
    try:
        yield
    except (OSError, sqlite3.OperationalError) as exc:
        cause = disk_full_cause(exc)
        if cause is None:
            raise
        raise DiskFullError(
            f"disk full: could not write {what} ({describe(cause)}); {intact}: "
            f"free space and run the same command to resume"
        ) from exc
