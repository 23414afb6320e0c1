"""Weights from the trainer to the explorer through files: the channel between processes.

The trainer publishes version ``v`` as ``<run_dir>/sync/v<v:06d>``, a Hugging Face model
folder written under a temporary name and renamed into place, so a reader never sees half
a folder. The explorer reads the newest published version. The last ``keep`` versions stay
on disk: a reader that is still loading one when it is pruned gets ``FileNotFoundError``
and simply asks for the newest again.
"""

from __future__ import annotations

import re
import shutil
from collections.abc import Callable
from pathlib import Path

_VERSION = re.compile(r"^v(\d{6,})$")


class WeightChannel:
    def __init__(self, run_dir: str | Path, keep: int = 2) -> None:
        self.root = Path(run_dir) / "sync"
        self.keep = keep

    def folder(self, version: int) -> Path:
        return self.root / f"v{version:06d}"

    def publish(self, version: int, save: Callable[[str], None]) -> Path:
        """Write version ``version`` with ``save(folder)`` (once), then prune old versions."""
        folder = self.folder(version)
        if not folder.exists():
            tmp = folder.with_name(folder.name + ".tmp")
            shutil.rmtree(tmp, ignore_errors=True)  # a writer killed mid-save
            self.root.mkdir(parents=True, exist_ok=True)
            save(str(tmp))
            tmp.replace(folder)
        for old in self.versions()[: -self.keep]:
            shutil.rmtree(self.folder(old), ignore_errors=True)
        return folder

    def versions(self) -> list[int]:
        """Published versions, oldest first."""
        if not self.root.is_dir():
            return []
        found = (_VERSION.match(p.name) for p in self.root.iterdir())
        return sorted(int(m.group(1)) for m in found if m)

    def latest(self) -> int | None:
        versions = self.versions()
        return versions[-1] if versions else None
