"""write_atomic: the whole new file or the old one, never a part, and nothing left behind."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from trinity_like.atomic import is_temporary, temporary_name, write_atomic


def test_text_bytes_and_a_writer_each_replace_the_file(tmp_path: Path) -> None:
    target = tmp_path / "state.json"
    write_atomic(target, "é\n")
    assert target.read_bytes() == "é\n".encode()
    write_atomic(target, b"\x00\x01")
    assert target.read_bytes() == b"\x00\x01"
    write_atomic(target, lambda tmp: Path(tmp).write_text("from a writer"))
    assert target.read_text() == "from a writer"
    assert os.listdir(tmp_path) == ["state.json"]
    assert oct(target.stat().st_mode & 0o777) == oct(0o666 & ~_umask())  # as open() would make it


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path: Path) -> None:
    target = tmp_path / "latest"
    target.write_text("step_000001")

    def half_then_fail(tmp: str) -> None:
        Path(tmp).write_text("step_0000")
        raise OSError(28, "No space left on device")

    with pytest.raises(OSError, match="No space"):
        write_atomic(target, half_then_fail)
    assert target.read_text() == "step_000001" and os.listdir(tmp_path) == ["latest"]
    with pytest.raises(FileNotFoundError):
        write_atomic(tmp_path / "no_folder" / "x", "y")
    assert os.listdir(tmp_path) == ["latest"]


def test_temporaries_are_unique_and_recognised(tmp_path: Path) -> None:
    a, b = temporary_name(tmp_path / "latest"), temporary_name(tmp_path / "latest")
    assert a != b and a.parent == tmp_path
    assert is_temporary(a.name, "latest") and not is_temporary(a.name, "lates") and not is_temporary("latest", "latest")


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
