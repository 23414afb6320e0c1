"""Atomic, verifiable checkpoints of a run directory.

Layout::

    <run_dir>/checkpoints/step_000010/
        model/            Hugging Face folder (safetensors + config + tokenizer) + optimizer state
        critic/           the value model, for algorithms with a critic
        state.json        step, model version, dataset / sample-strategy / buffer positions
        rng.json          Python, NumPy and torch RNG states
        manifest.json     sha256 and size of every file above: the content hash of the weights
    <run_dir>/checkpoints/latest     name of the newest complete checkpoint

A checkpoint is written into a temporary folder beside the others, fsynced, then renamed
into place, and only then does ``latest`` move (write + rename). A kill at any moment
leaves the previous checkpoint intact and ``latest`` pointing at it; leftover temporary
folders are removed on the next start. Only the ``keep_last`` newest are kept.

Resuming checks every file of the checkpoint against its manifest first: a truncated or
changed file (a disk that lied, a copy cut short) is an error naming the file and saying
how to resume from the checkpoint before it -- move the bad one aside and run the same
command; the buffer hands back the rows the later steps had consumed, so each is trained
once. The named points of :mod:`trinity_like.fault_points` let a test SIGKILL a save
anywhere in between (``tests/faults/test_checkpoint_kill.py``). A full disk during a save
is one line (:mod:`.disk_full`); the partial folder is removed and ``latest`` is untouched.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from trinity_like import fault_points
from trinity_like.errors import TrinityError
from trinity_like.pipeline.disk_full import DiskFullError, disk_full_as_error

LATEST = "latest"
MANIFEST = "manifest.json"
STATE = "state.json"


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _fsync_tree(root: Path) -> None:
    for path in sorted(root.rglob("*")):
        if path.is_file():
            with open(path, "rb") as fh:
                os.fsync(fh.fileno())
    fd = os.open(root, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` so a reader sees the old file or the whole new one, never a part."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def rng_state() -> dict[str, Any]:
    """Python, NumPy and torch RNG states as plain JSON (no pickle in checkpoints)."""
    version, internal, gauss = random.getstate()
    name, keys, pos, has_gauss, cached = np.random.get_state()
    return {
        "python": [version, list(internal), gauss],
        "numpy": [name, keys.tolist(), int(pos), int(has_gauss), float(cached)],
        "torch": torch.get_rng_state().tolist(),
    }


def set_rng_state(state: dict[str, Any]) -> None:
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    name, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((name, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(torch.tensor(state["torch"], dtype=torch.uint8))


class CheckpointManager:
    """Writes, finds, verifies and prunes the checkpoints of one run directory."""

    def __init__(self, run_dir: str | os.PathLike, keep_last: int = 2) -> None:
        self.root = Path(run_dir) / "checkpoints"
        self.keep_last = keep_last

    def clean_partial(self) -> list[str]:
        """Remove temporary folders a killed save left behind; returns their names."""
        if not self.root.exists():
            return []
        removed = []
        for p in self.root.iterdir():
            if p.name.startswith(".tmp-") or (p.name.startswith(".") and p.name.endswith(f"-{LATEST}")):
                shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink(missing_ok=True)
                removed.append(p.name)
        return removed

    def save(self, step: int, state: dict[str, Any], writers: dict[str, Callable[[str], None]]) -> Path:
        """Write checkpoint ``step``: each writer fills its sub-folder (``model``, ``critic``)."""
        self.root.mkdir(parents=True, exist_ok=True)
        name = f"step_{step:06d}"
        final = self.root / name
        tmp = self.root / f".tmp-{name}-{os.getpid()}"
        if tmp.exists():
            shutil.rmtree(tmp)
        previous = self.latest()
        intact = (
            f"nothing of it was kept and the previous checkpoint {previous.name} is intact"
            if previous
            else "nothing of it was kept (no earlier checkpoint)"
        )
        try:
            with disk_full_as_error(f"checkpoint {name} in {self.root}", intact):
                tmp.mkdir()
                fault_points.reach("before_weights")
                self._write_tmp(tmp, step, state, writers)
        except DiskFullError:
            shutil.rmtree(tmp, ignore_errors=True)  # the part written frees its space; latest is untouched
            raise
        if final.exists():  # a re-save of the same step (resumed run): replace it whole
            shutil.rmtree(final)
        os.replace(tmp, final)
        fault_points.reach("before_latest")
        write_atomic(self.root / LATEST, name)
        fault_points.reach("after_latest")
        self._prune()
        return final

    @staticmethod
    def _write_tmp(tmp: Path, step: int, state: dict[str, Any], writers: dict[str, Callable[[str], None]]) -> None:
        """Everything of checkpoint ``step`` into ``tmp``, manifest last, fsynced."""
        for sub, write in writers.items():
            fault_points.write("checkpoint_write", tmp / sub)
            write(str(tmp / sub))
        (tmp / STATE).write_text(json.dumps({"step": step, **state}, indent=1, sort_keys=True))
        (tmp / "rng.json").write_text(json.dumps(rng_state()))
        files = sorted(p for p in tmp.rglob("*") if p.is_file())
        manifest = {str(p.relative_to(tmp)): _sha256(p) for p in files}
        weights = [v for k, v in manifest.items() if k.endswith(".safetensors")]
        body = {
            "step": step,
            "files": manifest,
            "sizes": {str(p.relative_to(tmp)): p.stat().st_size for p in files},
            "weights_sha256": hashlib.sha256("".join(weights).encode()).hexdigest(),
        }
        (tmp / MANIFEST).write_text(json.dumps(body, indent=1, sort_keys=True))
        _fsync_tree(tmp)

    def _prune(self) -> None:
        done = self.list()
        for old in done[: max(0, len(done) - self.keep_last)]:
            shutil.rmtree(old, ignore_errors=True)

    def list(self) -> list[Path]:
        """Complete checkpoints, oldest first."""
        if not self.root.exists():
            return []
        return sorted(p for p in self.root.glob("step_*") if (p / MANIFEST).exists())

    def latest(self) -> Path | None:
        """The newest complete checkpoint (following ``latest``), or None."""
        pointer = self.root / LATEST
        if pointer.exists():
            path = self.root / pointer.read_text().strip()
            if (path / MANIFEST).exists():
                return path
        done = self.list()
        return done[-1] if done else None

    def verify(self, path: Path) -> dict[str, Any]:
        """Check every file against the manifest; returns the manifest. A mismatch is a
        :class:`TrinityError` naming the file and the way back to the checkpoint before it."""
        try:
            manifest = json.loads((path / MANIFEST).read_text())
            files, sizes = manifest["files"], manifest.get("sizes", {})
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise self._corrupt(path, MANIFEST, f"cannot be read ({exc})") from None
        for rel, digest in files.items():
            f = path / rel
            if not f.is_file():
                raise self._corrupt(path, rel, "is missing")
            size = f.stat().st_size
            if rel in sizes and size != sizes[rel]:
                raise self._corrupt(path, rel, f"is {size} bytes, {sizes[rel]} when saved (truncated?)")
            if _sha256(f) != digest:
                raise self._corrupt(path, rel, "does not match its sha256 in the manifest (bytes changed)")
        return manifest

    def _corrupt(self, path: Path, rel: str, what: str) -> TrinityError:
        earlier = [p for p in self.list() if p.name < path.name]
        way_back = (
            f"to resume from the checkpoint before it ({earlier[-1].name}), move this one aside "
            f"(mv {path} {path.parent / ('corrupt-' + path.name)}) and run the same command"
            if earlier
            else "no earlier checkpoint is left: move it aside to start the run over"
        )
        return TrinityError(f"checkpoint {path}: {rel} {what}; {way_back}")

    @staticmethod
    def read_state(path: Path) -> dict[str, Any]:
        return json.loads((path / STATE).read_text())

    @staticmethod
    def restore_rng(path: Path) -> None:
        set_rng_state(json.loads((path / "rng.json").read_text()))
