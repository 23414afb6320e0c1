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
from collections.abc import Iterator
from contextlib import closing, contextmanager
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

from trinity_like.buffer.rows import STATUSES, unpack, unpack_floats
from trinity_like.buffer.sqlite_storage import SqliteParams
from trinity_like.errors import TrinityError
from trinity_like.experience import Experience, PairExperience
from trinity_like.monitor.evals import EVALS_FILE, TRAINED_PAIRS_FILE, read_jsonl

METRICS_FILE = "metrics.jsonl"
EXPLORER_METRICS_FILE = "explorer/metrics.jsonl"  # an explorer process's own (modes explore / train)
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


def read_new_lines(path: Path, offset: int) -> tuple[list[dict[str, Any]], int]:
    """The JSON records of ``path`` from byte ``offset`` on, and the offset after the last complete line.

    A line still being written has no newline yet: it is left for the next call, so a page
    polling a live run never reads half a record. A missing file has none (offset 0).
    """
    if not path.is_file():
        return [], 0
    with open(path, "rb") as fh:
        fh.seek(offset)
        data = fh.read()
    end = data.rfind(b"\n") + 1
    return [json.loads(line) for line in data[:end].splitlines() if line.strip()], offset + end


def explorer_key(key: str) -> str:
    """An explorer process's metric as the curves name it: ``explorer/<key>``, except held-out
    metrics (``eval/*``: only the explorer evaluates in split mode) and its own ``explorer/*``."""
    return key if key.startswith(("eval/", "explorer/")) else f"explorer/{key}"


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

    def has_training_records(self) -> bool:
        """Whether the buffer has the ``trained`` table (buffers written before it existed do not)."""
        with self._db() as db:
            return (
                db.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'trained'").fetchone()
                is not None
            )

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
            f"SELECT r.kind, r.header, r.arrays, s.status, s.step{extra} FROM state s JOIN rows r ON r.seq = s.seq{join} "
            f"WHERE s.status IN ({marks}) AND s.model_version = ? ORDER BY s.seq"
        )
        with self._db() as db:
            got = db.execute(sql, (*range(len(STATUSES)), version)).fetchall()
        return [
            StoredRow(
                unpack(kind, header, blob),
                STATUSES[status],
                step,
                t_step,
                unpack_floats(layout, t_blob) if layout is not None else {},
            )
            for kind, header, blob, status, step, t_step, layout, t_blob in got
        ]


@dataclass(frozen=True)
class StoredRow:
    """One buffer row as the view shows it."""

    row: Experience | PairExperience
    status: str  # available | claimed | consumed | dropped
    consumed_by: int | None  # the checkpoint step that consumed it
    trained_at: int | None  # the step that trained on it, where the trainer recorded it
    trained: dict[
        str, list[float]
    ]  # what that step computed per token (rows.TrainedRecord): advantages, trainer_logprob


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
    def metrics(self, offset: int = 0, explorer_offset: int = 0) -> tuple[list[dict[str, Any]], int, int]:
        """Rows of ``metrics.jsonl`` and of an explorer process's ``explorer/metrics.jsonl``
        from byte offsets on, and the offsets after their last complete lines.

        In split mode (``explore`` / ``train``) the explorer process logs apart from the trainer;
        its rows join the curves under :func:`explorer_key` names, so its reward and phase
        times sit beside the trainer's (which has the same keys) instead of over them.
        """
        rows, end = read_new_lines(self.path / METRICS_FILE, offset)
        explored, explorer_end = read_new_lines(self.path / EXPLORER_METRICS_FILE, explorer_offset)
        rows += [{k if k == "step" else explorer_key(k): v for k, v in r.items()} for r in explored]
        return rows, end, explorer_end

    def evals(self) -> list[dict[str, Any]]:
        """Every item of every held-out evaluation (``evals.jsonl``, :mod:`trinity_like.monitor.evals`)."""
        path = self.path / EVALS_FILE
        return read_jsonl(path) if path.is_file() else []

    def trained_pairs(self) -> dict[int, list[dict[str, Any]]]:
        """``step -> pairs`` a DPO / RM stage trained on, each with what its loss reported for it
        (``trained_pairs.jsonl``). A pair written again at a step (a run resumed from an
        earlier checkpoint trains the same pairs again) replaces what was written of it before."""
        path = self.path / TRAINED_PAIRS_FILE
        out: dict[int, dict[str, dict[str, Any]]] = {}
        for item in read_jsonl(path) if path.is_file() else []:
            out.setdefault(item["step"], {})[item["task_id"]] = item
        return {step: list(pairs.values()) for step, pairs in sorted(out.items())}

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
        storage = self.config.get("buffer", {}).get("experience", {}).get("storage", "?")
        return (
            f"no buffer database at {self.buffer_path()} (buffer.experience.storage: {storage}); "
            "rollouts are shown from an on-disk SQLite buffer only"
        )

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
