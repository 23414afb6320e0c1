"""Weights from a train engine to a rollout engine on the same machine: one file in shared
memory, rewritten in place at every sync.

A sync through Ray's object store puts a new object per version (0.43 GB for SmolLM2-135M)
while the previous one is still referenced, and the store keeps the pages it ever used: a
20-step run held ~1.6 GB of store memory for one model's weights. Here the writer owns one
file in ``/dev/shm`` (the temp folder where there is none) sized for the state dict, and
each sync overwrites it: one copy of the weights in shared memory, whatever the number of
syncs. A reader maps the same file and samples from it as its own weights, with no copy::

    box = WeightMailbox()                    # the owner: creates, and at close removes, the file
    handle = box.write(model.state_dict())   # small and picklable: path + layout
    engine.update_weights(Borrowed(handle.tensors()))     # views of the file become the weights

The driver orders writes and reads: a sync writes the file and hands it to the explorer,
and the next write is the next sync, never while the explorer samples (an explorer that
ran during training would need a second file to switch to). Its name carries the owner's
process id; an owner that was killed leaves it behind, and the next mailbox on the machine
removes files whose owner is gone.
"""

from __future__ import annotations

import math
import os
import socket
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

import torch

from trinity_like import shm
from trinity_like.errors import TrinityError

PREFIX = "trinity-like-weights-"
ALIGN = 64  # byte alignment of each tensor in the file


def this_machine() -> str:
    """An id of this machine's running kernel: a file in its shared memory is visible to
    processes with the same id only."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        boot = ""
    return f"{socket.gethostname()}/{boot}"


@dataclass(frozen=True)
class Entry:
    name: str
    dtype: str  # torch dtype name without "torch."
    shape: tuple[int, ...]
    offset: int  # bytes from the file's start


@dataclass(frozen=True)
class SharedWeights:
    """A handle to weights in a mailbox file: what a reader needs to map them."""

    path: str
    machine: str  # this_machine() of the writer
    entries: tuple[Entry, ...]
    size: int  # bytes of the file

    def tensors(self) -> dict[str, torch.Tensor]:
        """The weights as views of the file: valid, and unchanged, until the writer's next write."""
        if self.machine != this_machine():
            raise TrinityError(
                f"weights were written to shared memory on {self.machine!r}, but this process runs on "
                f"{this_machine()!r}: the explorer and the trainer must share a machine to sync in memory"
            )
        buffer = _mapping(self.path, self.size)
        return {e.name: _view(buffer, e) for e in self.entries}


class WeightMailbox:
    """The writer's side: one file, created at the first write, resized when the layout
    changes, removed by :meth:`close`."""

    def __init__(self, directory: str | Path | None = None) -> None:
        folder = Path(directory) if directory is not None else shm.shm_dir()
        remove_orphans(folder)
        self.path = str(folder / f"{PREFIX}{os.getpid()}-{uuid.uuid4().hex[:12]}")

    def write(self, state: Mapping[str, torch.Tensor]) -> SharedWeights:
        """Copy ``state`` into the file (in place when its layout is unchanged)."""
        return write_into(self.path, state.items())

    def close(self) -> None:
        _MAPPINGS.pop(self.path, None)
        Path(self.path).unlink(missing_ok=True)


def write_into(path: str, items: Iterable[tuple[str, torch.Tensor]]) -> SharedWeights:
    """Write ``(name, tensor)`` pairs into the mailbox file ``path`` and return its handle.
    Every tensor is materialised first (the layout needs all shapes), so pass views."""
    tensors = [(name, t.detach()) for name, t in items]
    entries, offset = [], 0
    for name, t in tensors:
        entries.append(Entry(name, str(t.dtype).removeprefix("torch."), tuple(t.shape), offset))
        offset += _aligned(t.numel() * t.element_size())
    entries = tuple(entries)
    size = max(ALIGN, offset)
    if not Path(path).exists() or Path(path).stat().st_size != size:
        _MAPPINGS.pop(path, None)
        with open(path, "wb") as f:
            f.truncate(size)
    buffer = _mapping(path, size)
    with torch.no_grad():
        for entry, (_, t) in zip(entries, tensors):
            _view(buffer, entry).copy_(t)
    return SharedWeights(path=path, machine=this_machine(), entries=entries, size=size)


def remove_orphans(folder: Path, prefix: str = PREFIX) -> None:
    """Remove mailboxes in ``folder`` whose owner process is gone (:func:`trinity_like.shm.remove_orphans`)."""
    shm.remove_orphans(folder, prefix)


_MAPPINGS: dict[str, torch.Tensor] = {}  # path -> this process's mapping (uint8), kept across syncs


def _mapping(path: str, size: int) -> torch.Tensor:
    buffer = _MAPPINGS.get(path)
    if buffer is None or buffer.numel() != size:
        if not Path(path).exists():
            raise TrinityError(f"shared weights {path} are gone (their owner closed or was killed)")
        buffer = torch.from_file(path, shared=True, size=size, dtype=torch.uint8)
        _MAPPINGS[path] = buffer
    return buffer


def _view(buffer: torch.Tensor, entry: Entry) -> torch.Tensor:
    return buffer[entry.offset : entry.offset + _nbytes(entry)].view(getattr(torch, entry.dtype)).view(entry.shape)


def _nbytes(entry: Entry) -> int:
    return math.prod(entry.shape) * getattr(torch, entry.dtype).itemsize


def _aligned(nbytes: int) -> int:
    return -(-nbytes // ALIGN) * ALIGN
