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
once. A file the manifest does not list, a symbolic link, a pickle file (``*.bin``, ``*.pt``,
...) and a listed file that does not parse (a safetensors header, JSON, a model config) are
errors the same way (:func:`verify_folder`), and a run resumes only from a checkpoint folder
inside its own ``checkpoints/``: ``latest`` must be a file naming one (``step_000010``), and
the folder must resolve to a child of ``checkpoints/``. ``trinity-like export`` checks its
source with the same function (:func:`verify_export_source`); a client's ``save_state``
folder carries a manifest of its own (:func:`write_manifest`).

The named points of :mod:`trinity_like.fault_points` let a test SIGKILL a save
anywhere in between (``tests/faults/test_checkpoint_kill.py``). A full disk during a save
is one line (:mod:`.disk_full`); the partial folder is removed and ``latest`` is untouched.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
import shutil
import stat
from collections.abc import Callable
from pathlib import Path, PurePosixPath
from typing import Any

import numpy as np
import torch

from trinity_like import fault_points
from trinity_like.atomic import is_temporary, write_atomic
from trinity_like.errors import TrinityError
from trinity_like.pipeline.disk_full import DiskFullError, disk_full_as_error

LATEST = "latest"
MANIFEST = "manifest.json"
STATE = "state.json"
RNG = "rng.json"
STEP_NAME = re.compile(r"step_\d{6,}")  # the folder save() writes; what `latest` may name
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".pkl", ".pickle", ".ckpt")  # loading one can run code: never read


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


def write_manifest(folder: Path, step: int | None = None) -> dict[str, Any]:
    """``folder/manifest.json``: the sha256 and size of every file under ``folder`` (and ``step``)."""
    files = sorted(p for p in folder.rglob("*") if p.is_file() and p.name != MANIFEST)
    manifest = {str(p.relative_to(folder)): _sha256(p) for p in files}
    weights = [v for k, v in manifest.items() if k.endswith(".safetensors")]
    body = {
        **({"step": step} if step is not None else {}),
        "files": manifest,
        "sizes": {str(p.relative_to(folder)): p.stat().st_size for p in files},
        "weights_sha256": hashlib.sha256("".join(weights).encode()).hexdigest(),
    }
    (folder / MANIFEST).write_text(json.dumps(body, indent=1, sort_keys=True))
    return body


class BadCheckpointFile(TrinityError):
    """One file of a checkpoint folder is wrong: ``rel`` (its path in the folder) and ``what``."""

    def __init__(self, rel: str, what: str) -> None:
        super().__init__(f"{rel} {what}")
        self.rel, self.what = rel, what


def _read_manifest(folder: Path) -> tuple[dict[str, str], dict[str, int], dict[str, Any]]:
    try:
        manifest = json.loads((folder / MANIFEST).read_bytes().decode("utf-8"))
        files, sizes = manifest["files"], manifest.get("sizes", {})
        if not isinstance(files, dict) or not isinstance(sizes, dict):
            raise TypeError("'files' and 'sizes' must be objects")
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise BadCheckpointFile(MANIFEST, f"cannot be read ({_one_line(exc)})") from None
    for rel, digest in files.items():
        parts = PurePosixPath(rel).parts
        if PurePosixPath(rel).is_absolute() or not parts or any(x in ("", ".", "..") for x in parts) or "\\" in rel:
            raise BadCheckpointFile(MANIFEST, f"lists {rel!r}, a path outside the checkpoint folder")
        if not isinstance(digest, str) or not isinstance(sizes.get(rel, 0), int):
            raise BadCheckpointFile(MANIFEST, f"cannot be read (the entry of {rel!r} is not a sha256 and a size)")
    return files, sizes, manifest


def verify_folder(folder: Path) -> dict[str, Any]:
    """Check ``folder`` against its ``manifest.json``; returns the manifest. :class:`BadCheckpointFile`
    names the first problem: a listed file missing, of another size or sha256; anything the
    manifest does not list (a file, a folder of its own), a symbolic link, something that is not
    a regular file, a pickle file (listed or not: never loaded); a listed file that does not
    parse (:func:`_check_content`). Only what this returns as checked is read afterwards."""
    files, sizes, manifest = _read_manifest(folder)
    listed_dirs = {str(parent) for rel in files for parent in PurePosixPath(rel).parents if str(parent) != "."}
    for top, dirs, names in os.walk(folder):
        for name in sorted(dirs) + sorted(names):
            path = Path(top) / name
            rel = path.relative_to(folder).as_posix()
            mode = path.lstat().st_mode
            if rel.endswith(PICKLE_SUFFIXES):
                raise BadCheckpointFile(rel, "is a pickle file (loading one can run code): it is never read; remove it")
            if stat.S_ISLNK(mode):
                raise BadCheckpointFile(rel, f"is a symbolic link (to {os.readlink(path)}), not a file the save wrote")
            if stat.S_ISDIR(mode):
                if rel not in listed_dirs:
                    raise BadCheckpointFile(rel + "/", "holds no file of the manifest (added after the save?)")
            elif not stat.S_ISREG(mode):
                raise BadCheckpointFile(rel, "is not a regular file")
            elif rel != MANIFEST and rel not in files:
                raise BadCheckpointFile(rel, "is not in the manifest (added after the save?)")
    for rel, digest in files.items():
        f = folder / rel
        if not f.is_file():
            raise BadCheckpointFile(rel, "is missing")
        size = f.stat().st_size
        if rel in sizes and size != sizes[rel]:
            raise BadCheckpointFile(rel, f"is {size} bytes, {sizes[rel]} when saved (truncated?)")
        if _sha256(f) != digest:
            raise BadCheckpointFile(rel, "does not match its sha256 in the manifest (bytes changed)")
    for rel in files:
        _check_content(folder, rel)
    return manifest


def _check_content(folder: Path, rel: str) -> None:
    """A file whose bytes match the manifest may still not parse (a manifest written over a
    damaged file): a safetensors header and its offsets, a JSON object, a model config."""
    path = folder / rel
    if rel.endswith(".safetensors"):
        from safetensors import SafetensorError, safe_open

        try:
            with safe_open(str(path), framework="pt") as fh:
                names = fh.keys()
                for key in names:
                    fh.get_slice(key).get_shape()
        except (SafetensorError, OSError, ValueError, RuntimeError) as exc:
            raise BadCheckpointFile(rel, f"is not a readable safetensors file ({_one_line(exc)})") from None
    elif rel.endswith(".json"):
        try:
            data = json.loads(path.read_bytes().decode("utf-8"))
        except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError
            raise BadCheckpointFile(rel, f"is not JSON ({_one_line(exc)})") from None
        if not isinstance(data, dict):
            raise BadCheckpointFile(rel, f"is not a JSON object (a {type(data).__name__})")
        if rel == STATE and (not isinstance(data.get("step"), int) or isinstance(data["step"], bool)):
            raise BadCheckpointFile(rel, f"has no whole-number 'step' (got {data.get('step')!r:.40})")
        if PurePosixPath(rel).name == "config.json":
            from transformers import AutoConfig

            try:
                AutoConfig.from_pretrained(str(path.parent))
            except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
                raise BadCheckpointFile(rel, f"is not a model config transformers reads ({_one_line(exc)})") from None


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text if len(text) <= 200 else text[:197] + "..."


def verify_export_source(path: str | os.PathLike) -> None:
    """What ``trinity-like export`` reads, checked first (:func:`verify_folder`): a run's checkpoint
    (``step_N``, or its ``model`` folder: the manifest is the checkpoint's) or a client's
    ``save_state`` folder. A folder without a manifest is refused: nothing says its files are
    the ones a save wrote."""
    path = Path(path)
    if not path.is_dir():
        raise TrinityError(f"{path} {'is not a folder' if path.exists() else 'does not exist'}")
    folder = path if (path / MANIFEST).is_file() else path.parent
    if not (folder / MANIFEST).is_file():
        raise TrinityError(
            f"{path} is not a checkpoint: no {MANIFEST} there or in its parent to check its files against "
            f"(export takes a run's checkpoints/step_N or a client's save_state folder)"
        )
    try:
        verify_folder(folder)
    except BadCheckpointFile as exc:
        raise TrinityError(f"checkpoint {folder}: {exc}; nothing exported") from None


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
            if p.name.startswith(".tmp-") or is_temporary(p.name, LATEST):
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
        try:
            previous = self.latest()
        except TrinityError:  # a pointer no resume read (checkpoint.resume: false): this save replaces it
            previous = None
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
        if final.is_symlink():  # not ours: the link goes, never what it points to
            final.unlink()
        elif final.exists():  # a re-save of the same step (resumed run): replace it whole
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
        (tmp / RNG).write_text(json.dumps(rng_state()))
        write_manifest(tmp, step)
        _fsync_tree(tmp)

    def _prune(self) -> None:
        done = self.list()
        for old in done[: max(0, len(done) - self.keep_last)]:
            shutil.rmtree(old, ignore_errors=True)

    def list(self) -> list[Path]:
        """Complete checkpoints, oldest first."""
        if not self.root.exists():
            return []
        return sorted(p for p in self.root.glob("step_*") if STEP_NAME.fullmatch(p.name) and (p / MANIFEST).exists())

    def latest(self) -> Path | None:
        """The newest complete checkpoint (following ``latest``), or None. A pointer that is not
        the file a save writes, or names anything but a checkpoint folder here, is an error, as
        is a checkpoint folder that resolves outside ``checkpoints/`` (:meth:`inside`)."""
        pointer = self.root / LATEST
        if pointer.is_symlink() or pointer.exists():
            path = self.root / self._pointed(pointer)
            if (path / MANIFEST).exists():
                return self.inside(path)
        done = self.list()
        return self.inside(done[-1]) if done else None

    def _pointed(self, pointer: Path) -> str:
        """The checkpoint name in ``latest``: opened without following a link or blocking on a FIFO."""
        way = f"a run resumes only from a checkpoint folder inside {self.root}: remove {pointer} to resume from the newest there"
        try:
            fd = os.open(pointer, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError:
            target = os.readlink(pointer) if pointer.is_symlink() else "?"
            raise TrinityError(
                f"{pointer} is a symbolic link (to {target}), not the file a save writes; {way}"
            ) from None
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise TrinityError(f"{pointer} is not a regular file; {way}")
            text = os.read(fd, 256).decode("utf-8", "replace").strip()
        finally:
            os.close(fd)
        if not STEP_NAME.fullmatch(text):
            raise TrinityError(f"{pointer} names {text[:80]!r}, not a checkpoint folder (step_NNNNNN); {way}")
        return text

    def inside(self, path: Path) -> Path:
        """``path`` if it is a folder of this run's ``checkpoints/`` once links are resolved, else a
        :class:`TrinityError`: a step folder that is a link to elsewhere is never resumed from."""
        resolved, root = path.resolve(), self.root.resolve()
        if path.is_symlink() or resolved.parent != root or not resolved.is_dir():
            raise TrinityError(
                f"checkpoint {path} resolves to {resolved}, not a folder inside {self.root}: a run resumes "
                f"only from its own checkpoints; move it aside (mv {path} {path.parent / ('corrupt-' + path.name)}) "
                "and run the same command"
            )
        return path

    def verify(self, path: Path) -> dict[str, Any]:
        """Check ``path`` (inside :meth:`inside`) against its manifest (:func:`verify_folder`);
        returns the manifest. A problem is a :class:`TrinityError` naming the file and the way
        back to the checkpoint before it."""
        self.inside(path)
        try:
            return verify_folder(path)
        except BadCheckpointFile as exc:
            raise self._corrupt(path, exc.rel, exc.what) from None

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

    def restore_rng(self, path: Path) -> None:
        """The RNG states of ``rng.json``; one that does not hold them (a hand edit under a
        manifest written to match) is the error :meth:`verify` gives."""
        try:
            set_rng_state(json.loads((path / RNG).read_text()))
        except (ValueError, TypeError, KeyError, IndexError, OverflowError, RuntimeError) as exc:
            what = f"does not hold the RNG states a save writes ({type(exc).__name__}: {_one_line(exc)})"
            raise self._corrupt(path, RNG, what) from None
