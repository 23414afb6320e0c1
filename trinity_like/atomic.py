"""Whole files written so that a reader sees the old file or the whole new one, never a part.

The new content goes to a temporary file beside the target (same folder, so the rename
cannot cross filesystems), is flushed to the disk, and is renamed over the target: a
process killed at any moment leaves either file whole, and a failed write leaves nothing
behind. The temporary name is ``.<name>.<pid>-<random>.tmp``, unique per writer::

    write_atomic(run_dir / "latest", "step_000010")
    write_atomic(out, lambda tmp: fig.savefig(tmp))      # a writer that wants a path
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Callable
from pathlib import Path


def temporary_name(target: str | os.PathLike) -> Path:
    """A fresh temporary path beside ``target`` (what :func:`write_atomic` writes first)."""
    target = Path(target)
    return target.with_name(f".{target.name}.{os.getpid()}-{secrets.token_hex(4)}.tmp")


def is_temporary(name: str, target_name: str) -> bool:
    """Whether file ``name`` is a temporary of :func:`write_atomic` for ``target_name`` (a killed writer's leftover)."""
    return name.startswith(f".{target_name}.") and name.endswith(".tmp")


def write_atomic(path: str | os.PathLike, content: str | bytes | Callable[[str], None]) -> None:
    """Replace ``path`` with ``content``: text (UTF-8), bytes, or a function that writes the file
    at the path it is given (``savefig``, ``safetensors.torch.save_file``)."""
    tmp = temporary_name(path)
    try:
        if callable(content):
            content(str(tmp))
        else:
            with open(tmp, "xb") as fh:
                fh.write(content.encode("utf-8") if isinstance(content, str) else content)
        fd = os.open(tmp, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
