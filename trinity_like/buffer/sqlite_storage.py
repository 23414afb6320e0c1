"""The persistent buffer: one SQLite database file in the run directory.

Why SQLite: Trinity-RFT keeps experiences in an in-memory queue and loses them when a run
restarts. Here every row lives in a WAL-mode database that an explorer process writes and
a trainer process reads at the same time, and every change is one transaction, so a
process killed at any instant leaves either all or nothing of what it was doing.

A row's life::

    put ──► available ──claim──► claimed ──commit(step)──► consumed (by step)
                │                   │
                └─drop_older_than─► dropped      claimed, never committed: back to available
                                                 when a reader opens (first claim or recover)

The exactly-once contract with the trainer (one reader; any number of writers):

1. claim the rows of a step, train on them;
2. save the checkpoint of step ``s``, then call ``commit(s)`` -- before claiming again;
3. on resume, call ``recover(s)`` with the step of the checkpoint resumed from.

``recover`` reconciles the buffer with the checkpoint: if the run died between saving the
checkpoint and committing, the claimed rows *are* in the checkpoint and become consumed by
``s``; otherwise they return to available. Rows consumed by steps after ``s`` (a newer
checkpoint that was lost) become available again. So no experience is lost and none is
trained on twice, wherever the kill lands (tests/buffer/test_crash.py kills both sides).

What the trainer computed for a row it trained on (its advantages, its own logprobs) is
kept in a side table, ``trained`` (:meth:`SqliteStorage.record_trained`), for people to
look at (``trinity-like view``); nothing in the contract reads it. A record exists only
for a row that is claimed or consumed: ``recover`` deletes the records of rows it returns
to available, so a resumed run never shows what a lost step computed. Databases written
before the table existed get it the first time a writer opens them; readers of such a
file see no records.

Example::

    buf = SqliteStorage(params=SqliteParams(), run_dir="runs/demo")
    buf.put([Experience(tokens=[1, 2, 3], prompt_length=1, model_version=4)])
    rows = buf.claim(1, order="newest_version", min_model_version=3, timeout=1.0)
    ...  # train, save checkpoint 7
    buf.commit(7)
    buf.record_trained(7, [TrainedRecord(eid, {"advantages": [...], "trainer_logprob": [...]})])
"""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from trinity_like.buffer.base import ORDERS
from trinity_like.buffer.groups import take_whole_groups, unit_key
from trinity_like.buffer.rows import (
    STATUSES,
    Row,
    TrainedRecord,
    check_claim_args,
    check_status,
    model_version,
    pack,
    pack_floats,
    unpack,
    unpack_floats,
)
from trinity_like.registry import BUFFER_STORAGE

T = TypeVar("T")
_BUSY = (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED)
_CODE = {name: i for i, name in enumerate(STATUSES)}  # status name -> integer stored
AVAILABLE, CLAIMED, CONSUMED, DROPPED = (_CODE[s] for s in STATUSES)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS rows (           -- what was written, never updated
    seq INTEGER PRIMARY KEY,                -- write order (fifo): rows are never deleted
    eid TEXT NOT NULL UNIQUE,               -- the row's id: a retried put adds nothing
    kind TEXT NOT NULL,                     -- "experience" | "pair"
    header TEXT NOT NULL,                   -- the row's scalar fields as JSON (rows.pack)
    arrays BLOB NOT NULL                    -- its token / per-token lists, packed
);
CREATE TABLE IF NOT EXISTS state (          -- where each row is in its life
    seq INTEGER PRIMARY KEY,                -- rows.seq
    status INTEGER NOT NULL,                -- index into STATUSES
    model_version INTEGER NOT NULL,
    step INTEGER                            -- training step that consumed it
);
-- State lives apart from the payload so a claim or commit rewrites a few bytes per row,
-- not a 512-token record. One index per claim order, each in exactly that order and
-- covering the staleness filter: a claim reads n entries, however many rows wait.
CREATE INDEX IF NOT EXISTS state_fifo ON state (status, seq, model_version);
CREATE INDEX IF NOT EXISTS state_newest ON state (status, model_version DESC, seq);
CREATE TABLE IF NOT EXISTS trained (        -- what the trainer computed for a row (record_trained)
    seq INTEGER PRIMARY KEY,                -- rows.seq
    step INTEGER NOT NULL,                  -- the training step that computed it
    layout TEXT NOT NULL,                   -- JSON {name: length} of the float64 lists in `arrays`
    arrays BLOB NOT NULL                    -- per response token: advantages, trainer_logprob (rows.TrainedRecord)
);
CREATE TABLE IF NOT EXISTS commits (step INTEGER PRIMARY KEY, n_rows INTEGER NOT NULL, at REAL NOT NULL);
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
"""

_ORDER_SQL = {  # order -> (index, ORDER BY)
    "fifo": ("state_fifo", "s.seq"),
    "newest_version": ("state_newest", "s.model_version DESC, s.seq"),
}
# A row's unit (trinity_like.buffer.groups): its group's id and size, read from the header
# (an older database's rows have no group_size: each is a unit of its own).
_UNIT_SQL = "r.eid, json_extract(r.header, '$.group_id'), json_extract(r.header, '$.group_size')"


@dataclass(frozen=True)
class SqliteParams:
    """Where the database lives and how long to wait for it."""

    path: str = "buffer.sqlite"  # database file; a relative path is taken inside the run directory
    busy_timeout_s: float = 60.0  # how long a statement waits for another process's write lock
    poll_interval_s: float = 0.005  # first pause of a claim waiting for rows; doubles up to 0.1 s
    synchronous: str = "NORMAL"  # NORMAL survives a killed process; FULL also a power cut (slower)


@BUFFER_STORAGE.register_module("sqlite")
class SqliteStorage:
    """Persistent SQLite buffer (default): crash-safe claims, exactly-once consumption."""

    def __init__(self, *, params: SqliteParams, run_dir: str | Path | None = None) -> None:
        if params.synchronous not in ("OFF", "NORMAL", "FULL", "EXTRA"):
            raise ValueError(f"synchronous must be OFF, NORMAL, FULL or EXTRA, got {params.synchronous!r}")
        path = Path(params.path).expanduser()
        if run_dir is not None and not path.is_absolute():
            path = Path(run_dir) / path
        path.parent.mkdir(parents=True, exist_ok=True)
        self.params = params
        self.path = path
        self._lock = threading.Lock()  # one connection per instance, shared by its threads
        self._db = sqlite3.connect(
            str(path), timeout=params.busy_timeout_s, isolation_level=None, check_same_thread=False
        )
        # 16 KiB pages hold a 512-token row without a chain of overflow pages: 2x faster
        # writes than the default 4 KiB (takes effect when the file is created).
        for pragma in ("page_size=16384", "journal_mode=WAL", f"synchronous={params.synchronous}"):
            self._retry(lambda pragma=pragma: self._db.execute(f"PRAGMA {pragma}").fetchall())
        with self._tx() as db:  # schema statements one by one: executescript would commit early
            for statement in _SCHEMA.split(";"):
                if statement.strip():
                    db.execute(statement)
        self._recovered = False  # reader side: dead claims not yet returned (see recover)
        self._writing = False  # writer side: the writer-done flag cleared by this instance

    # -- transactions ------------------------------------------------------------
    def _retry(self, fn: Callable[[], T]) -> T:
        """``fn()``, retried while SQLite answers "busy" without waiting, up to ``busy_timeout_s``.

        The busy timeout covers waiting for another writer, but SQLite returns SQLITE_BUSY
        at once while a connection recovers the WAL of a killed process or the last one
        out cleans it up (https://sqlite.org/wal.html#sometimes_queries_return_sqlite_busy_in_wal_mode).
        """
        deadline = time.monotonic() + self.params.busy_timeout_s
        pause = 0.001
        while True:
            try:
                return fn()
            except sqlite3.OperationalError as exc:
                if exc.sqlite_errorcode & 0xFF not in _BUSY or time.monotonic() > deadline:
                    raise
            time.sleep(pause)
            pause = min(pause * 2, 0.05)

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        """One write transaction: the write lock is taken up front, so no deadlock on upgrade."""
        with self._lock:
            self._retry(lambda: self._db.execute("BEGIN IMMEDIATE"))
            try:
                yield self._db
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")

    def _read(self, sql: str, args: Sequence[object] = ()) -> list[tuple]:
        with self._lock:
            return self._retry(lambda: self._db.execute(sql, args).fetchall())

    # -- writer side -------------------------------------------------------------
    def put(self, rows: Sequence[Row]) -> None:
        """Append ``rows`` in one transaction; a row whose ``eid`` is stored already is skipped."""
        records = [(r.eid, *pack(r), model_version(r)) for r in rows]
        if not records:
            return
        with self._tx() as db:
            for eid, kind, header, blob, version in records:
                cur = db.execute(
                    "INSERT OR IGNORE INTO rows (eid, kind, header, arrays) VALUES (?, ?, ?, ?)",
                    (eid, kind, header, blob),
                )
                if cur.rowcount:  # 0: a retried put of a stored row
                    db.execute(
                        "INSERT INTO state (seq, status, model_version) VALUES (?, ?, ?)",
                        (cur.lastrowid, AVAILABLE, version),
                    )
            if not self._writing:  # a writer (re)starts: claims wait for its rows again
                db.execute("DELETE FROM meta WHERE key = 'writer_done'")
        self._writing = True

    def mark_writer_done(self) -> None:
        """No more rows will come: a claim waiting for ``n`` rows returns what there is."""
        with self._tx() as db:
            db.execute("INSERT OR REPLACE INTO meta VALUES ('writer_done', '1')")
        self._writing = False

    def writer_done(self) -> bool:
        return bool(self._read("SELECT 1 FROM meta WHERE key = 'writer_done'"))

    # -- reader side -------------------------------------------------------------
    def claim(
        self,
        n: int,
        *,
        order: str = "fifo",
        min_model_version: int | None = None,
        timeout: float | None = None,
    ) -> list[Row]:
        """Claim up to ``n`` available rows; waits until ``n`` are there, the writer is done, or ``timeout``.

        ``order`` is "fifo" (oldest write first) or "newest_version" (highest model
        version first, oldest write among equals). Rows below ``min_model_version`` are
        left where they are (see :meth:`drop_older_than` to retire them).
        """
        check_claim_args(n, order, ORDERS)
        self._recover_once()
        floor = -(2**62) if min_model_version is None else int(min_model_version)
        deadline = None if timeout is None else time.monotonic() + timeout
        pause = self.params.poll_interval_s
        while True:
            out_of_time = deadline is not None and time.monotonic() >= deadline
            if out_of_time or self._full(n, order, floor) or self.writer_done():
                return self._take(n, order, floor)
            time.sleep(pause if deadline is None else max(0.0, min(pause, deadline - time.monotonic())))
            pause = min(pause * 2, 0.1)

    @staticmethod
    def _pick(db: sqlite3.Connection, n: int, order: str, floor: int) -> tuple[list[int], bool]:
        """The seqs a claim of ``n`` takes now (whole groups only), and whether it is full
        (:func:`~trinity_like.buffer.groups.take_whole_groups`). The walk follows the order's
        index and stops as soon as the claim is decided: about ``n`` rows read, however many wait."""
        index, order_by = _ORDER_SQL[order]
        cur = db.execute(
            f"SELECT s.seq, {_UNIT_SQL} FROM state s INDEXED BY {index} JOIN rows r ON r.seq = s.seq "
            f"WHERE s.status = ? AND s.model_version >= ? ORDER BY {order_by}",
            (AVAILABLE, floor),
        )
        try:
            return take_whole_groups(((seq, *unit_key(eid, gid, size)) for seq, eid, gid, size in cur), n)
        finally:
            cur.close()

    def _full(self, n: int, order: str, floor: int) -> bool:
        with self._lock:
            return self._retry(lambda: self._pick(self._db, n, order, floor))[1]

    def _take(self, n: int, order: str, floor: int) -> list[Row]:
        if n == 0:
            return []
        with self._tx() as db:
            seqs, _ = self._pick(db, n, order, floor)
            marks = ",".join("?" * len(seqs))
            db.execute(f"UPDATE state SET status = ? WHERE seq IN ({marks})", (CLAIMED, *seqs))
        # Payloads never change, so they are read after the write lock is released.
        found = {
            seq: (kind, header, blob)
            for seq, kind, header, blob in self._read(
                f"SELECT seq, kind, header, arrays FROM rows WHERE seq IN ({marks})", seqs
            )
        }
        return [unpack(*found[seq]) for seq in seqs]

    def record_trained(self, step: int, records: Sequence[TrainedRecord]) -> None:
        """Keep what step ``step`` computed for rows it trained on (one transaction).

        A record replaces an earlier one of the same row; a record of a row this buffer does
        not hold (an expert row of MIX, read from its dataset) is skipped.
        """
        packed = [(step, *pack_floats(r.arrays), r.eid) for r in records]
        if not packed:
            return
        with self._tx() as db:
            db.executemany(
                "INSERT OR REPLACE INTO trained (seq, step, layout, arrays) "
                "SELECT seq, ?, ?, ? FROM rows WHERE eid = ?",
                packed,
            )

    def trained(self) -> dict[str, tuple[int, dict[str, list[float]]]]:
        """``eid -> (step, arrays)`` of every record: for tests and post-mortems."""
        got = self._read("SELECT eid, step, layout, t.arrays FROM trained t JOIN rows USING (seq)")
        return {eid: (step, unpack_floats(layout, blob)) for eid, step, layout, blob in got}

    def drop_older_than(self, model_version: int) -> int:
        """Mark available rows sampled before ``model_version`` as dropped, with the rest of
        their groups (rows of one group share their version; should one lag, the others would
        wait for it for ever); returns how many."""
        with self._tx() as db:
            old = db.execute(
                f"SELECT s.seq, {_UNIT_SQL} FROM state s INDEXED BY state_newest JOIN rows r ON r.seq = s.seq "
                "WHERE s.status = ? AND s.model_version < ?",
                (AVAILABLE, model_version),
            ).fetchall()
            seqs = {seq for seq, *_ in old}
            groups = sorted({gid for _, eid, gid, size in old if unit_key(eid, gid, size)[0].startswith("g:")})
            for at in range(0, len(groups), 500):
                chunk = groups[at : at + 500]
                seqs |= {
                    seq
                    for (seq,) in db.execute(
                        "SELECT s.seq FROM state s JOIN rows r ON r.seq = s.seq WHERE s.status = ? "
                        f"AND json_extract(r.header, '$.group_id') IN ({','.join('?' * len(chunk))})",
                        (AVAILABLE, *chunk),
                    )
                }
            ordered = sorted(seqs)
            for at in range(0, len(ordered), 500):
                chunk = ordered[at : at + 500]
                db.execute(
                    f"UPDATE state SET status = ? WHERE seq IN ({','.join('?' * len(chunk))})", (DROPPED, *chunk)
                )
            return len(ordered)

    def commit(self, step: int) -> None:
        """Mark every claimed row consumed by ``step``, and record the step.

        Call it right after the checkpoint of ``step`` is saved. Committing a step that is
        recorded already, with nothing claimed since, does nothing (idempotent); claiming
        rows and committing them under an old step number is an error.
        """
        if step < 1:
            raise ValueError(f"commit({step}): steps count from 1 (step 0 is the initial model)")
        self._recover_once()
        with self._tx() as db:
            last = self._last_step(db)
            if last is not None and step <= last:
                n_claimed = db.execute("SELECT COUNT(*) FROM state WHERE status = ?", (CLAIMED,)).fetchall()[0][0]
                if n_claimed:
                    raise ValueError(
                        f"commit({step}): step {last} is committed already and {n_claimed} rows are claimed"
                    )
                return
            self._consume_claimed(db, step)

    @staticmethod
    def _consume_claimed(db: sqlite3.Connection, step: int) -> None:
        cur = db.execute("UPDATE state SET status = ?, step = ? WHERE status = ?", (CONSUMED, step, CLAIMED))
        db.execute("INSERT INTO commits VALUES (?, ?, ?)", (step, cur.rowcount, time.time()))

    @staticmethod
    def _last_step(db: sqlite3.Connection) -> int | None:
        return db.execute("SELECT MAX(step) FROM commits").fetchall()[0][0]

    def last_committed_step(self) -> int | None:
        """The highest step committed so far (None before the first commit)."""
        return self._read("SELECT MAX(step) FROM commits")[0][0]

    def recover(self, checkpoint_step: int | None = None) -> dict[str, int]:
        """Reconcile the buffer with the checkpoint a run resumes from; returns what moved.

        ``checkpoint_step`` None means "no checkpoint to match": only uncommitted claims
        return to available. With a step ``s`` (0: the initial model, nothing trained):
        claims made before the checkpoint of ``s`` was saved (``s`` newer than the last
        commit) become consumed by ``s``; rows consumed by steps after ``s`` become
        available again; other claims return too.
        """
        moved = {"committed": 0, "released": 0, "restored": 0}
        with self._tx() as db:
            if checkpoint_step is not None:
                last = self._last_step(db)
                if checkpoint_step > (last or 0):  # saved, then killed before commit(step)
                    n = db.execute("SELECT COUNT(*) FROM state WHERE status = ?", (CLAIMED,)).fetchall()[0][0]
                    if n:
                        self._consume_claimed(db, checkpoint_step)
                        moved["committed"] = n
                cur = db.execute(
                    "UPDATE state SET status = ?, step = NULL WHERE status = ? AND step > ?",
                    (AVAILABLE, CONSUMED, checkpoint_step),
                )
                moved["restored"] = cur.rowcount
                db.execute("DELETE FROM commits WHERE step > ?", (checkpoint_step,))
            cur = db.execute("UPDATE state SET status = ? WHERE status = ?", (AVAILABLE, CLAIMED))
            moved["released"] = cur.rowcount
            # what a lost step computed goes with it: records stay only for rows consumed
            db.execute("DELETE FROM trained WHERE seq IN (SELECT seq FROM state WHERE status = ?)", (AVAILABLE,))
        self._recovered = True
        return moved

    def _recover_once(self) -> None:
        """The first reader call of this instance returns a dead reader's claims."""
        if not self._recovered:
            self.recover(None)

    # -- inspection --------------------------------------------------------------
    def count(self, status: str = "available") -> int:
        """Rows in a state: "available", "claimed", "consumed", "dropped"."""
        code = _CODE[check_status(status)]
        return self._read("SELECT COUNT(*) FROM state WHERE status = ?", (code,))[0][0]

    def statuses(self) -> dict[str, tuple[str, int | None]]:
        """``eid -> (status, step)`` of every row: for tests and post-mortems."""
        got = self._read("SELECT eid, status, step FROM rows JOIN state USING (seq)")
        return {eid: (STATUSES[code], step) for eid, code, step in got}

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def __enter__(self) -> SqliteStorage:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
