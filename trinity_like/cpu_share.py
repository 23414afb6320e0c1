"""The explorer and the trainer on the same CPU cores: each at full width while the other
waits, its share while both compute.

With ``synchronizer.offset >= 1`` the explorer actor explores while the `verl` workers
train, on one node's cores. Both at full width put twice the threads on the cores, and
rollout and update each ran 2-3x slower (docs/async.md). A fixed half each leaves a core
idle whenever one side waits, and the explorer waits most of an update: its rollout is the
shorter of the two. So the two sides share a board, two bytes in shared memory that say
who is computing now. Each side sets its own byte around its work. At each point where it
can change width (a decode step of a rollout, a micro-batch of an update) it takes every
core when the other's byte is clear and its share when it is set::

    cores = CoreShare.create(share=(1, 1), wide=(2, 2))   # the driver; close() removes the board
    with cores.computing(EXPLORER):                    # the explorer actor, around a rollout
        cores.fit(EXPLORER)                            # before each decode step: 1 or 2 threads

The board is a file in ``/dev/shm`` named by the driver's process id, so it reaches only
processes on the driver's machine (:meth:`trinity_like.config.schema.Config.cpu_threads`
splits only a locally started Ray). A driver that was killed leaves its board behind; the
next board on the machine removes it.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from trinity_like.shm import remove_orphans, shm_dir

if TYPE_CHECKING:  # torch loads where a board is used: a recipe's schema reads this module
    import torch

PREFIX = "trinity-like-cores-"
EXPLORER, TRAINER = 0, 1  # the two sides: a byte each on the board
SIDES = ("explorer", "trainer")


class CpuThreads(NamedTuple):
    """Torch threads per process (:meth:`trinity_like.config.schema.Config.cpu_threads`)."""

    explorer: int  # the explorer actor's (when shared: while the trainer computes too)
    trainer: int  # each CPU `verl` worker's (when shared: while the explorer computes too)
    explorer_alone: int  # when shared: the explorer's while the trainer waits
    trainer_alone: int  # when shared: each worker's while the explorer waits
    shared: bool  # the two take turns at full width (trinity_like/cpu_share.py); False: fixed widths


@dataclass(frozen=True)
class CoreShare:
    """The board (picklable: its path and the widths; each process maps the file itself)."""

    path: str
    share: tuple[int, int]  # torch threads of (explorer, trainer) while both compute
    wide: tuple[int, int]  # torch threads of (explorer, trainer) while the other waits

    @classmethod
    def for_threads(cls, threads: CpuThreads) -> CoreShare | None:
        """The board of a recipe's :meth:`~trinity_like.config.schema.Config.cpu_threads`; None when not shared."""
        if not threads.shared:
            return None
        return cls.create((threads.explorer, threads.trainer), (threads.explorer_alone, threads.trainer_alone))

    @classmethod
    def create(cls, share: tuple[int, int], wide: tuple[int, int]) -> CoreShare:
        folder = shm_dir()
        remove_orphans(folder, PREFIX)
        path = folder / f"{PREFIX}{os.getpid()}-{uuid.uuid4().hex[:12]}"
        path.write_bytes(bytes(len(SIDES)))
        return cls(str(path), share, wide)

    def _board(self) -> torch.Tensor:
        import torch

        board = _BOARDS.get(self.path)
        if board is None:
            board = _BOARDS[self.path] = torch.from_file(self.path, shared=True, size=len(SIDES), dtype=torch.uint8)
        return board

    @contextmanager
    def computing(self, side: int) -> Iterator[None]:
        """``side`` computes inside the block (its byte is set, and cleared however it ends)."""
        board = self._board()
        board[side] = 1
        try:
            yield
        finally:
            board[side] = 0

    def threads(self, side: int) -> int:
        """The width ``side`` may take now: its share while the other computes, else every core."""
        return (self.share if int(self._board()[1 - side]) else self.wide)[side]

    def fit(self, side: int) -> int:
        """Set this process's torch threads to :meth:`threads`; returns them."""
        n = self.threads(side)
        import torch

        if torch.get_num_threads() != n:
            torch.set_num_threads(n)
        return n

    def close(self) -> None:
        _BOARDS.pop(self.path, None)
        Path(self.path).unlink(missing_ok=True)


_BOARDS: dict[str, torch.Tensor] = {}  # path -> this process's mapping of the board
