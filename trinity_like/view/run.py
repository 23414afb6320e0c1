"""A run directory read for a person: its metrics, the rollouts in its buffer, its held-out answers.

Everything here only reads. The buffer is opened through SQLite's read-only URI modes, a
new connection per request, so a run that another process is still writing is never
blocked or changed (a WAL reader takes no lock a writer waits on):

- ``mode=ro`` while a ``-wal`` file is beside the database: a process has it open (or died
  with it open) and the reader must see what the WAL holds;
- ``immutable=1`` otherwise: the run is finished (or copied from another machine) and
  fully checkpointed. ``mode=ro`` would leave empty ``-wal``/``-shm`` files behind in the
  run directory; ``immutable`` touches nothing, not even a lock.

Rollouts are shown per *model version* -- the trainer step whose weights sampled them
(each row records it; version 0 is the starting model), which is also the step of the
held-out evaluation of the same weights. A row a step trained on carries what the trainer
recorded for it (the buffer's ``trained`` table: advantages, the trainer's logprobs); a
buffer from before that table reads as rows without records. A DPO / RM run has no buffer:
its steps are training steps, each with its pairs (``trained_pairs.jsonl``). Example::

    run = Run.open("runs/grpo_arith")
    rows, offset, explorer_offset = run.metrics()   # later: run.metrics(offset, explorer_offset): what is new
    stored = run.buffer().rows(3)                   # the page of a step: view.rollouts.step_page(run, 3)
"""

from __future__ import annotations

import json
import sqlite3
import threading
from contextlib import closing
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

from trinity_like.buffer.rows import STATUSES
from trinity_like.buffer.sqlite_storage import SqliteParams
from trinity_like.errors import TrinityError
from trinity_like.experience import Experience
from trinity_like.monitor.evals import EVALS_FILE, TRAINED_PAIRS_FILE, read_items
from trinity_like.monitor.jsonl import Read, line_at, read_records, warn
from trinity_like.monitor.sinks import METRICS_ROW
from trinity_like.view.stored import StoredRow, decode_row

METRICS_FILE = "metrics.jsonl"
EXPLORER_METRICS_FILE = "explorer/metrics.jsonl"  # an explorer process's own (modes explore / train)
CONFIG_FILE = "config.json"
MAX_CONFIG_BYTES = 16 * 2**20  # a run's config.json is a few KB
MAX_WARNINGS = 50  # kept for the page; each is printed once on stderr


class BufferUnreadable(TrinityError):
    """The run's SQLite buffer cannot be read (damaged, not a database, locked): one line naming it."""


_SQLITE_WHY = {  # SQLite's message -> what a person can do about it
    "file is not a database": "not a SQLite database (damaged, or not a buffer)",
    "database disk image is malformed": "damaged (database disk image is malformed)",
    "database is locked": "locked by another process: try again",
    "no such table": "not a trinity-like buffer",
    "no such column": "not a trinity-like buffer",
}


@dataclass(frozen=True)
class Filters:
    """Which samples of a step to show; None keeps everything."""

    reward_min: float | None = None
    reward_max: float | None = None
    length_min: int | None = None  # response tokens
    length_max: int | None = None
    finish_reason: str | None = None  # "stop" | "length" | ...
    text: str | None = None  # case-insensitive, in the prompt or the response

    def keep(self, row: Experience, prompt: str, response: str) -> bool:
        reward, length = row.reward, row.response_length
        if self.reward_min is not None and (reward is None or reward < self.reward_min):
            return False
        if self.reward_max is not None and (reward is None or reward > self.reward_max):
            return False
        if self.length_min is not None and length < self.length_min:
            return False
        if self.length_max is not None and length > self.length_max:
            return False
        if self.finish_reason and row.finish_reason != self.finish_reason:
            return False
        return not self.text or self.text.lower() in (prompt + "\n" + response).lower()


def connect_read_only(path: Path) -> sqlite3.Connection:
    """A connection that can neither write ``path`` nor block its writers (see the module doc)."""
    live = path.with_name(path.name + "-wal").exists()
    db = sqlite3.connect(f"{path.resolve().as_uri()}?{'mode=ro' if live else 'immutable=1'}", uri=True, timeout=1.0)
    db.execute("PRAGMA query_only = 1")
    return db


def explorer_key(key: str) -> str:
    """An explorer process's metric as the curves name it: ``explorer/<key>``, except held-out
    metrics (``eval/*``: only the explorer evaluates in split mode) and its own ``explorer/*``."""
    return key if key.startswith(("eval/", "explorer/")) else f"explorer/{key}"


class Buffer:
    """Read-only queries over a run's SQLite buffer (the schema of :mod:`trinity_like.buffer.sqlite_storage`).

    A file SQLite cannot read (damaged, not a database, a table missing, locked) is a
    :class:`BufferUnreadable` naming it; a row that does not decode is skipped and named in
    :attr:`skipped` (``rows``), so one bad row does not hide its step.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self.skipped: list[str] = []  # rows the last ``rows`` call could not decode, and why

    def _query(self, sql: str, params: tuple = ()) -> list[tuple]:
        try:
            with closing(connect_read_only(self.path)) as db:
                return db.execute(sql, params).fetchall()
        except sqlite3.Error as exc:
            text = " ".join(str(exc).split())
            why = next((w for key, w in _SQLITE_WHY.items() if text.startswith(key)), "cannot be read")
            raise BufferUnreadable(f"{self.path}: {why} ({text})") from None

    def versions(self) -> list[dict[str, int]]:
        """``[{"version": v, "rows": n}, ...]``: how many rows each model version sampled."""
        got = self._query("SELECT model_version, COUNT(*) FROM state GROUP BY model_version ORDER BY model_version")
        return [{"version": v, "rows": n} for v, n in got if type(v) is int]

    def has_training_records(self) -> bool:
        """Whether the buffer has the ``trained`` table (buffers written before it existed do not)."""
        return bool(self._query("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'trained'"))

    def rows(self, version: int) -> list[StoredRow]:
        """Every row of ``version``, in write order, with what the trainer recorded for it.

        ``status IN (...)`` lets the ``state_newest`` index (status, model_version, seq)
        answer the version filter: the query reads only that version's rows.
        """
        marks = ",".join("?" * len(STATUSES))
        trained = self.has_training_records()
        extra = ", t.step, t.layout, t.arrays" if trained else ", NULL, NULL, NULL"
        join = " LEFT JOIN trained t ON t.seq = s.seq" if trained else ""
        sql = (
            f"SELECT s.seq, r.kind, r.header, r.arrays, s.status, s.step{extra} FROM state s "
            f"JOIN rows r ON r.seq = s.seq{join} WHERE s.status IN ({marks}) AND s.model_version = ? ORDER BY s.seq"
        )
        out, self.skipped = [], []
        for seq, *fields in self._query(sql, (*range(len(STATUSES)), version)):
            row, why = decode_row(*fields)
            if row is None:
                self.skipped.append(f"row {seq}: {why}")
            else:
                out.append(row)
        return out


def setting(config: dict[str, Any], *keys: str) -> Any:
    """``config[k1][k2]...``, None where a level is missing or is not a mapping."""
    node: Any = config
    for key in keys:
        node = node.get(key) if isinstance(node, dict) else None
    return node


class Run:
    """One run directory, opened for reading.

    A damaged line of its JSON Lines files is skipped and named once (:meth:`warn`): on
    stderr, and in :attr:`warnings` for the page.
    """

    def __init__(self, path: Path, config: dict[str, Any]) -> None:
        self.path = path
        self.config = config
        name = config.get("name")
        self.name = name if isinstance(name, str) and name else path.name
        self.tokenizer_error = ""
        self.warnings: list[str] = []
        self._warned: set[str] = set()
        self._lines: dict[tuple[str, int], int] = {}  # (file, byte offset) -> its line number
        self._lock = threading.Lock()

    @classmethod
    def open(cls, path: str | Path) -> Run:
        """The run in ``path``; a folder that is not a run is a one-line :class:`TrinityError`."""
        path = Path(path)
        if not path.is_dir():
            raise TrinityError(f"{path}: no such folder")
        config_file = path / CONFIG_FILE
        if not config_file.is_file() and not (path / METRICS_FILE).is_file():
            raise TrinityError(
                f"{path}: not a run directory (no {CONFIG_FILE} or {METRICS_FILE}) nor a comparison (no compare.json)"
            )
        config: Any = {}
        if config_file.is_file():
            try:
                with open(config_file, "rb") as fh:
                    text = fh.read(MAX_CONFIG_BYTES + 1)
                if len(text) > MAX_CONFIG_BYTES:
                    raise TrinityError(
                        f"{config_file}: larger than {MAX_CONFIG_BYTES // 2**20} MiB: not a run's config"
                    )
                config = json.loads(text)
            except (ValueError, RecursionError) as exc:
                raise TrinityError(f"{config_file}: not valid JSON ({' '.join(str(exc).split())[:200]})") from None
            except OSError as exc:
                raise TrinityError(f"{config_file}: cannot be read ({exc.strerror})") from None
            if not isinstance(config, dict):
                raise TrinityError(f"{config_file}: not a run's config (a JSON {type(config).__name__}, not an object)")
        return cls(path, config)

    def warn(self, messages: list[str]) -> None:
        """Report each of ``messages`` once: one line on stderr, and kept for the page."""
        with self._lock:
            new = [m for m in messages if m not in self._warned]
            self._warned.update(new)
            self.warnings += new[: max(0, MAX_WARNINGS - len(self.warnings))]
        for message in new:
            warn(message)

    # -- metrics and evaluations -------------------------------------------------------------
    def _read(self, name: str, offset: int, max_bytes: int | None) -> Read:
        """Records of the run's file ``name`` from byte ``offset`` (its damaged lines reported)."""
        path = self.path / name
        if not path.is_file():
            return Read(name, end=0)
        with self._lock:
            line = self._lines.get((name, offset))
        if line is None:
            line = line_at(path, offset)
        got = read_records(path, offset, line, check=METRICS_ROW, max_bytes=max_bytes, name=str(path))
        with self._lock:
            if len(self._lines) > 4096:  # offsets no page asks for again (a client that made them up)
                self._lines.clear()
            self._lines[(name, got.end)] = got.next_line
        self.warn(got.messages())
        return got

    def metrics(
        self, offset: int = 0, explorer_offset: int = 0, max_bytes: int | None = None
    ) -> tuple[list[dict[str, Any]], int, int]:
        """Rows of ``metrics.jsonl`` and of an explorer process's ``explorer/metrics.jsonl``
        from byte offsets on, and the offsets after their last complete lines.

        A line still being written has no newline yet: it is left for the next call, so a page
        polling a live run never reads half a record. ``max_bytes``: read about this much of
        each file at most (the next call goes on from the offsets returned).

        In split mode (``explore`` / ``train``) the explorer process logs apart from the trainer;
        its rows join the curves under :func:`explorer_key` names, so its reward and phase
        times sit beside the trainer's (which has the same keys) instead of over them.
        """
        got = self._read(METRICS_FILE, offset, max_bytes)
        explored = self._read(EXPLORER_METRICS_FILE, explorer_offset, max_bytes)
        rows = [r for _, r in got.records]
        rows += [{k if k == "step" else explorer_key(k): v for k, v in r.items()} for _, r in explored.records]
        return rows, got.end, explored.end

    def main_metrics(self) -> list[dict[str, Any]]:
        """Every row of ``metrics.jsonl`` alone (not an explorer process's), as :meth:`metrics` reads it."""
        return [r for _, r in self._read(METRICS_FILE, 0, None).records]

    def _items(self, name: str) -> list[dict[str, Any]]:
        path = self.path / name
        if not path.is_file():
            return []
        got = read_items(path)
        self.warn(got.messages())
        return [r for _, r in got.records]

    def evals(self) -> list[dict[str, Any]]:
        """Every item of every held-out evaluation (``evals.jsonl``, :mod:`trinity_like.monitor.evals`)."""
        return self._items(EVALS_FILE)

    def trained_pairs(self) -> dict[int, list[dict[str, Any]]]:
        """``step -> pairs`` a DPO / RM stage trained on, each with what its loss reported for it
        (``trained_pairs.jsonl``). A pair written again at a step (a run resumed from an
        earlier checkpoint trains the same pairs again) replaces what was written of it before."""
        out: dict[int, dict[str, dict[str, Any]]] = {}
        for item in self._items(TRAINED_PAIRS_FILE):
            if item["kind"] == "pair":
                out.setdefault(item["step"], {})[item["task_id"]] = item
        return {step: list(pairs.values()) for step, pairs in sorted(out.items())}

    # -- the buffer ----------------------------------------------------------------------------
    def buffer_path(self) -> Path:
        """Where the recipe put the SQLite buffer (``buffer.experience.args.path``), inside this folder.

        An absolute path from another machine (a copied run) is looked for here by its name.
        """
        given = setting(self.config, "buffer", "experience", "args", "path")
        path = Path(given if isinstance(given, str) and given and "\0" not in given else SqliteParams.path)
        if not path.is_absolute():
            return self.path / path
        return path if path.is_file() else self.path / path.name

    def buffer(self) -> Buffer | None:
        path = self.buffer_path()
        return Buffer(path) if path.is_file() else None

    def steps(self) -> list[dict[str, int]]:
        """``[{"version": v, "rows": n}, ...]``: the buffer's model versions, or the training steps
        of a DPO / RM stage's pairs (no buffer: ``trained_pairs.jsonl``)."""
        buffer = self.buffer()
        if buffer is not None:
            return buffer.versions()
        return [{"version": step, "rows": len(pairs)} for step, pairs in self.trained_pairs().items()]

    def buffer_missing(self) -> str:
        """Why there are no rollouts to show ("" when there are)."""
        if self.buffer() is not None or (self.path / TRAINED_PAIRS_FILE).is_file():
            return ""
        storage = setting(self.config, "buffer", "experience", "storage") or "?"
        return (
            f"no buffer database at {self.buffer_path()} (buffer.experience.storage: {storage}); "
            "rollouts are shown from an on-disk SQLite buffer only"
        )

    @cached_property
    def tokenizer(self) -> Any:
        """The run's tokenizer (from ``model.path``), or None with :attr:`tokenizer_error` saying why."""
        from trinity_like.models.resolve import load_tokenizer

        model = setting(self.config, "model", "path")
        if not isinstance(model, str) or not model:
            self.tokenizer_error = "the run names no model.path: tokens are shown as ids"
            return None
        try:
            return load_tokenizer(model)
        except (TrinityError, OSError, ValueError) as exc:
            self.tokenizer_error = f"tokenizer of {model!r} unavailable here ({exc}): tokens are shown as ids"
            return None

    def decode(self, sequences: list[list[int]]) -> list[str]:
        tok = self.tokenizer
        if tok is None:
            return [" ".join(map(str, ids)) for ids in sequences]
        try:
            return tok.batch_decode(sequences, skip_special_tokens=False)
        except (OverflowError, TypeError, ValueError, IndexError):  # an id no tokenizer has: shown as ids
            return [" ".join(map(str, ids)) for ids in sequences]

    def pieces(self, ids: list[int]) -> list[str]:
        """Each token's own text (ids when there is no tokenizer), for per-token colouring."""
        return self.decode([[i] for i in ids]) if self.tokenizer is not None else [f"[{i}]" for i in ids]
