"""``tinker://`` paths as folders under the server's data directory.

A training run ``RUN`` (the SDK's model id, ``<session>:train:<n>``) keeps its files in
``<data_dir>/runs/<RUN>/`` -- the folder the in-process ``TrainingClient`` writes to::

    tinker://RUN/weights/NAME          <data_dir>/runs/RUN/state/NAME             (save_state)
    tinker://RUN/sampler_weights/NAME  <data_dir>/runs/RUN/sampler_weights/NAME   (save_weights_for_sampler)
    (the run itself)                   <data_dir>/runs/RUN/run.json               (base model, LoRA rank)

A path names nothing outside the data directory: every part is a plain name of at most
``CHECKPOINT_NAME_MAX`` characters, and no error message shows where the directory is.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from tinker import types

from trinity_like.client.training import CHECKPOINT_NAME_MAX
from trinity_like.errors import TrinityError

SCHEME = "tinker://"
KINDS = {"weights": "state", "sampler_weights": "sampler_weights"}  # path segment -> the client's folder
CHECKPOINT_TYPES = {"weights": "training", "sampler_weights": "sampler"}
RUN_FILE = "run.json"
_NAME = re.compile(r"[A-Za-z0-9_.:-]+")


class PathError(TrinityError, ValueError):
    """A ``tinker://`` path that is malformed or names nothing saved here."""


def check_name(name: str | None, what: str) -> str:
    if name is None:
        raise PathError(f"{what} is required")
    if not isinstance(name, str) or not _NAME.fullmatch(name) or name in (".", ".."):
        raise PathError(f"{what} {str(name)[:80]!r} must be a plain name (letters, digits, _ . : -; not empty)")
    if len(name) > CHECKPOINT_NAME_MAX:
        raise PathError(f"{what} of {len(name)} characters: at most {CHECKPOINT_NAME_MAX}")
    return name


@dataclass(frozen=True)
class TinkerPath:
    run: str  # the training run (model id)
    kind: str  # "weights" or "sampler_weights"
    name: str  # the checkpoint's name

    @staticmethod
    def parse(path: str) -> TinkerPath:
        if not isinstance(path, str) or not path.startswith(SCHEME):
            raise PathError(f"{path!r} is not a tinker:// path (tinker://RUN/weights/NAME or .../sampler_weights/NAME)")
        parts = path[len(SCHEME) :].split("/")
        if len(parts) != 3 or parts[1] not in KINDS:
            raise PathError(f"{path!r}: expected tinker://RUN/weights/NAME or tinker://RUN/sampler_weights/NAME")
        return TinkerPath(check_name(parts[0], "run"), parts[1], check_name(parts[2], "checkpoint name"))

    def __str__(self) -> str:
        return f"{SCHEME}{self.run}/{self.kind}/{self.name}"


class Store:
    """The data directory: run folders, their records and checkpoints."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = Path(data_dir)
        self.runs_dir = self.data_dir / "runs"
        self.runs_dir.mkdir(parents=True, exist_ok=True)

    def run_dir(self, run: str) -> Path:
        return self.runs_dir / check_name(run, "run")

    def folder(self, path: TinkerPath) -> Path:
        return self.run_dir(path.run) / KINDS[path.kind] / path.name

    def existing(self, path: str, kind: str | None = None) -> Path:
        """The folder of a saved checkpoint; ``kind`` (a path segment) restricts what it may be."""
        parsed = TinkerPath.parse(path)
        if kind is not None and parsed.kind != kind:
            raise PathError(f"{path!r} is a {parsed.kind} checkpoint; this call needs tinker://RUN/{kind}/NAME")
        folder = self.folder(parsed)
        if not folder.is_dir():
            raise PathError(f"{path!r}: no such checkpoint on this server")
        return folder

    def tinker_path(self, run: str, folder: str | Path) -> str:
        """The ``tinker://`` path of a folder the training client wrote in run ``run``."""
        folder = Path(folder)
        kind = {v: k for k, v in KINDS.items()}[folder.parent.name]
        return str(TinkerPath(run, kind, folder.name))

    # -- run records ----------------------------------------------------------------------
    def write_run(self, run: str, base_model: str, lora_rank: int | None) -> None:
        record = {"base_model": base_model, "lora_rank": lora_rank, "created": _now().isoformat()}
        self.run_dir(run).mkdir(parents=True, exist_ok=True)
        (self.run_dir(run) / RUN_FILE).write_text(json.dumps(record))

    def read_run(self, run: str) -> dict:
        file = self.run_dir(run) / RUN_FILE
        if not file.is_file():
            raise PathError(f"no training run {run!r} on this server")
        return json.loads(file.read_text())

    def checkpoints(self, run: str) -> list[types.Checkpoint]:
        """Every checkpoint of ``run``, oldest first (half-written ones are hidden)."""
        self.read_run(run)
        out = []
        for kind, sub in KINDS.items():
            for folder in sorted((self.run_dir(run) / sub).glob("[!.]*")):
                if folder.is_dir():
                    stat = folder.stat()
                    size = sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())
                    out.append(
                        types.Checkpoint(
                            checkpoint_id=f"{kind}/{folder.name}",
                            checkpoint_type=CHECKPOINT_TYPES[kind],
                            time=datetime.fromtimestamp(stat.st_mtime, timezone.utc),
                            tinker_path=str(TinkerPath(run, kind, folder.name)),
                            size_bytes=size,
                        )
                    )
        return sorted(out, key=lambda c: c.time)

    def training_run(self, run: str) -> types.TrainingRun:
        record = self.read_run(run)
        checkpoints = self.checkpoints(run)
        last = {t: [c for c in checkpoints if c.checkpoint_type == t] for t in ("training", "sampler")}
        return types.TrainingRun(
            training_run_id=run,
            base_model=record["base_model"],
            model_owner="local",
            is_lora=record["lora_rank"] is not None,
            lora_rank=record["lora_rank"],
            last_request_time=datetime.fromisoformat(record["created"]),
            last_checkpoint=last["training"][-1] if last["training"] else None,
            last_sampler_checkpoint=last["sampler"][-1] if last["sampler"] else None,
        )

    def runs(self) -> list[str]:
        return sorted(p.name for p in self.runs_dir.iterdir() if (p / RUN_FILE).is_file())


def _now() -> datetime:
    return datetime.now(timezone.utc)
