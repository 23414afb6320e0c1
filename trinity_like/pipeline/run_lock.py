"""One run per run directory: an exclusive lock that a killed run cannot leave stuck.

Two runs writing one run directory would claim the same buffer rows, save over each
other's checkpoints and train steps twice. A stage therefore holds an ``fcntl.flock`` on a
lock file in its run directory from the moment it opens the directory until it closes.
The kernel drops such a lock when its process ends, however it ends (SIGKILL, OOM, a
lost node's reboot), so there is no stale lock to remove by hand: the next run simply gets it.

Split modes run an explorer process and a trainer process on one directory, so the lock is
per role: ``explore`` takes ``.lock-explorer``, ``train`` and offline stages take
``.lock-trainer``, and ``both`` takes the two. The file holds who has it (pid, host, start
time, command), for the message the second run prints::

    RunLock.probe(Path("runs/grpo_arith"), "both")            # RunInUseError at once if taken
    lock = RunLock.acquire(Path("runs/grpo_arith"), "both")   # RunInUseError if taken
    ...
    lock.release()                                            # (or the process ends)

:meth:`RunLock.probe` asks without holding and without writing anything, so a run can refuse
before its slow start (loading the tokenizer, validating data) instead of after it; the
lock a stage holds is still the one :meth:`RunLock.acquire` takes when it opens the directory.

``flock`` is advisory and local to one machine's kernel (on NFS it may not exclude a run on
another node); the run directory of a multi-node run lives on the driver's machine.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from trinity_like.errors import TrinityError

LOCKS_OF_ROLE = {
    "both": ("trainer", "explorer"),
    "explore": ("explorer",),
    "train": ("trainer",),
    "offline": ("trainer",),
}


class RunInUseError(TrinityError):
    """Another live process holds the run directory (for the same role)."""


def lock_file(run_dir: Path, part: str) -> Path:
    return run_dir / f".lock-{part}"


def _holder(path: Path) -> str:
    """Who holds ``path``, as its owner wrote it (best effort: it may be mid-write)."""
    try:
        info = json.loads(path.read_text(encoding="utf-8") or "{}")
    except (OSError, ValueError):
        return "another process"
    since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(info.get("since", 0)))
    return f"pid {info.get('pid', '?')} on {info.get('host', '?')} since {since}: {info.get('command', '?')!r}"


@dataclass
class RunLock:
    """The locks of one stage's role on its run directory; :meth:`release` (or exit) frees them."""

    run_dir: Path
    fds: dict[str, int]  # part ("trainer" / "explorer") -> the open, flocked file

    @classmethod
    def acquire(cls, run_dir: Path, role: str) -> RunLock:
        """Take every lock ``role`` needs, at once or not at all (:class:`RunInUseError`)."""
        run_dir.mkdir(parents=True, exist_ok=True)
        lock = cls(run_dir, {})
        try:
            for part in LOCKS_OF_ROLE[role]:
                lock.fds[part] = _take(lock_file(run_dir, part), role, run_dir)
        except BaseException:
            lock.release()
            raise
        return lock

    @staticmethod
    def probe(run_dir: Path, role: str) -> None:
        """:class:`RunInUseError` now if a live run holds a lock ``role`` needs; creates nothing.

        A directory or lock file that does not exist yet is free (no run ever held it), and so
        is one that cannot exist (a file where a folder of its path should be: the recipe's
        checks name the key that put it there)."""
        for part in LOCKS_OF_ROLE[role]:
            path = lock_file(run_dir, part)
            try:
                fd = os.open(path, os.O_RDONLY)  # flock needs no write access
            except (FileNotFoundError, NotADirectoryError):
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise _in_use(path, run_dir) from None
            finally:
                os.close(fd)  # drops the probe's own lock, if it got one

    def release(self) -> None:
        for fd in self.fds.values():
            os.close(fd)  # closing the only descriptor drops the flock
        self.fds.clear()


def _take(path: Path, role: str, run_dir: Path) -> int:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)  # not inherited by processes this one starts
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise _in_use(path, run_dir) from None
    info = {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "since": time.time(),
        "role": role,
        "command": " ".join(sys.argv),
    }
    os.ftruncate(fd, 0)
    os.pwrite(fd, json.dumps(info).encode(), 0)
    return fd


def _in_use(path: Path, run_dir: Path) -> RunInUseError:
    return RunInUseError(
        f"{run_dir}: in use by another run ({_holder(path)}); two runs on one run directory would "
        f"train steps twice: wait for it to end, or give this run another name (name=...)"
    )
