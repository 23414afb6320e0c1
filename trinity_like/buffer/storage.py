"""The built-in buffer storages, registered in BUFFER_STORAGE when this module is imported.

:func:`trinity_like.plugins.load_plugins` imports it in every process, so ``sqlite``,
``memory`` and ``jsonl`` resolve everywhere a name is looked up. :func:`open_storage`
builds one from its registered name and the recipe's params mapping.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from trinity_like.buffer import jsonl_storage, memory_storage, sqlite_storage  # noqa: F401  (registration)
from trinity_like.components import build_params
from trinity_like.registry import BUFFER_STORAGE


def open_storage(
    name: str = "sqlite", params: Mapping[str, Any] | None = None, *, run_dir: str | Path | None = None
) -> Any:
    """The storage registered as ``name``, built from ``params`` (unknown keys are errors)."""
    cls = BUFFER_STORAGE.get(name)
    return cls(params=build_params(cls, params, where=f"buffer.{name}"), run_dir=run_dir)
