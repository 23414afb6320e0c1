"""Files in shared memory that one process owns and others map: where they live, and the
removal of those a killed owner left behind.

The weight mailboxes (:mod:`trinity_like.trainer.shared_weights`) and the CPU board
(:mod:`trinity_like.cpu_share`) are such files. Each is named ``<prefix><owner pid>-<random>``,
so the next one created on the machine can tell an orphan from a live file::

    folder = shm_dir()
    remove_orphans(folder, "trinity-like-cores-")   # files of owners that are gone
    path = folder / f"trinity-like-cores-{os.getpid()}-{uuid.uuid4().hex[:12]}"
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import psutil


def shm_dir() -> Path:
    """Where such files live: ``/dev/shm`` (memory, never written to disk) where it exists."""
    shm = Path("/dev/shm")
    return shm if shm.is_dir() and os.access(shm, os.W_OK) else Path(tempfile.gettempdir())


def remove_orphans(folder: Path, prefix: str) -> None:
    """Remove files ``<prefix><pid>-...`` in ``folder`` whose owner process is gone (killed before its close)."""
    for f in folder.glob(f"{prefix}*"):
        pid = f.name.removeprefix(prefix).split("-", 1)[0]
        if pid.isdigit() and not psutil.pid_exists(int(pid)):
            f.unlink(missing_ok=True)
