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
held-out evaluation of the same weights. Example::

    run = Run.open("runs/grpo_arith")
    rows, offset = run.metrics()              # later: run.metrics(offset) returns what is new
    page = run.rollouts(version=3, filters=Filters(reward_min=1.0))
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from contextlib import closing, contextmanager
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

from trinity_like.buffer.rows import STATUSES, unpack
from trinity_like.buffer.sqlite_storage import SqliteParams
from trinity_like.errors import TrinityError
from trinity_like.experience import Experience, PairExperience
from trinity_like.monitor.evals import EVALS_FILE, read_jsonl

METRICS_FILE = "metrics.jsonl"
CONFIG_FILE = "config.json"


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
    db = sqlite3.connect(f"{path.resolve().as_uri()}?{'mode=ro' if live else 'immutable=1'}", uri=True)
    db.execute("PRAGMA query_only = 1")
    return db


class Buffer:
    """Read-only queries over a run's SQLite buffer (the schema of :mod:`trinity_like.buffer.sqlite_storage`)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    @contextmanager
    def _db(self) -> Iterator[sqlite3.Connection]:
        with closing(connect_read_only(self.path)) as db:
            yield db

    def versions(self) -> list[dict[str, int]]:
        """``[{"version": v, "rows": n}, ...]``: how many rows each model version sampled."""
        with self._db() as db:
            got = db.execute("SELECT model_version, COUNT(*) FROM state GROUP BY model_version ORDER BY model_version")
            return [{"version": v, "rows": n} for v, n in got]

    def rows(self, version: int) -> list[tuple[Experience | PairExperience, str, int | None]]:
        """``(row, status, step that consumed it)`` of every row of ``version``, in write order.

        ``status IN (...)`` lets the ``state_newest`` index (status, model_version, seq)
        answer the version filter: the query reads only that version's rows.
        """
        marks = ",".join("?" * len(STATUSES))
        sql = ("SELECT r.kind, r.header, r.arrays, s.status, s.step FROM state s JOIN rows r ON r.seq = s.seq "
               f"WHERE s.status IN ({marks}) AND s.model_version = ? ORDER BY s.seq")
        with self._db() as db:
            got = db.execute(sql, (*range(len(STATUSES)), version)).fetchall()
        return [(unpack(kind, header, blob), STATUSES[status], step) for kind, header, blob, status, step in got]


class Run:
    """One run directory, opened for reading."""

    def __init__(self, path: Path, config: dict[str, Any]) -> None:
        self.path = path
        self.config = config
        self.name = config.get("name") or path.name
        self.tokenizer_error = ""

    @classmethod
    def open(cls, path: str | Path) -> Run:
        """The run in ``path``; a folder that is not a run is a one-line :class:`TrinityError`."""
        path = Path(path)
        if not path.is_dir():
            raise TrinityError(f"{path}: no such folder")
        config_file = path / CONFIG_FILE
        if not config_file.is_file() and not (path / METRICS_FILE).is_file():
            raise TrinityError(f"{path}: not a run directory (no {CONFIG_FILE} or {METRICS_FILE})")
        try:
            config = json.loads(config_file.read_text()) if config_file.is_file() else {}
        except json.JSONDecodeError as exc:
            raise TrinityError(f"{config_file}: not valid JSON ({exc})") from None
        return cls(path, config)

    # -- metrics and evaluations -------------------------------------------------------------
    def metrics(self, offset: int = 0) -> tuple[list[dict[str, Any]], int]:
        """Rows of ``metrics.jsonl`` from byte ``offset`` on, and the offset after the last complete line.

        A line still being written has no newline yet: it is left for the next call, so a
        page polling a live run never reads half a record.
        """
        path = self.path / METRICS_FILE
        if not path.is_file():
            return [], 0
        with open(path, "rb") as fh:
            fh.seek(offset)
            data = fh.read()
        end = data.rfind(b"\n") + 1
        rows = [json.loads(line) for line in data[:end].splitlines() if line.strip()]
        return rows, offset + end

    def evals(self) -> list[dict[str, Any]]:
        """Every item of every held-out evaluation (``evals.jsonl``, :mod:`trinity_like.monitor.evals`)."""
        path = self.path / EVALS_FILE
        return read_jsonl(path) if path.is_file() else []

    # -- the buffer ----------------------------------------------------------------------------
    def buffer_path(self) -> Path:
        """Where the recipe put the SQLite buffer (``buffer.experience.args.path``), inside this folder.

        An absolute path from another machine (a copied run) is looked for here by its name.
        """
        args = self.config.get("buffer", {}).get("experience", {}).get("args") or {}
        path = Path(args.get("path") or SqliteParams.path)
        if not path.is_absolute():
            return self.path / path
        return path if path.is_file() else self.path / path.name

    def buffer(self) -> Buffer | None:
        path = self.buffer_path()
        return Buffer(path) if path.is_file() else None

    def buffer_missing(self) -> str:
        """Why there are no rollouts to show ("" when there are)."""
        if self.buffer() is not None:
            return ""
        storage = self.config.get("buffer", {}).get("experience", {}).get("storage", "?")
        return (f"no buffer database at {self.buffer_path()} (buffer.experience.storage: {storage}); "
                "rollouts are shown from an on-disk SQLite buffer only")

    @cached_property
    def tokenizer(self) -> Any:
        """The run's tokenizer (from ``model.path``), or None with :attr:`tokenizer_error` saying why."""
        from trinity_like.models.resolve import load_tokenizer

        model = self.config.get("model", {}).get("path")
        if not model:
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
        return tok.batch_decode(sequences, skip_special_tokens=False)

    def pieces(self, ids: list[int]) -> list[str]:
        """Each token's own text (ids when there is no tokenizer), for per-token colouring."""
        return self.decode([[i] for i in ids]) if self.tokenizer is not None else [f"[{i}]" for i in ids]
