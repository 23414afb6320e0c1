"""Fault points fire where they are armed, and under TRINITY_LIKE_FAULT_ONCE once per run."""

from __future__ import annotations

import errno
import os
import subprocess
import sys

import pytest

from trinity_like import fault_points

# each child is a fresh process: it counts arrivals afresh, as a restarted worker does
CHILD = "from trinity_like import fault_points\nfor _ in range(3):\n    fault_points.write('buffer_write', 'x')\n"


def child(env: dict[str, str]) -> subprocess.CompletedProcess:
    full = {k: v for k, v in os.environ.items() if k not in (fault_points.ENV_VAR, fault_points.ONCE_VAR)}
    return subprocess.run([sys.executable, "-c", CHILD], env={**full, **env}, capture_output=True, text=True)


def test_an_armed_point_fires_in_every_new_process_without_the_once_file(tmp_path):
    armed = {fault_points.ENV_VAR: "buffer_write:2"}
    for _ in range(2):
        out = child(armed)
        assert out.returncode == 1 and "No space left on device" in out.stderr.splitlines()[-1], out.stderr


def test_with_the_once_file_only_the_first_process_to_get_there_fails(tmp_path):
    once = tmp_path / "fired"
    armed = {fault_points.ENV_VAR: "buffer_write:2", fault_points.ONCE_VAR: str(once)}
    first, second = child(armed), child(armed)
    assert first.returncode == 1 and "No space left on device" in first.stderr, first.stderr
    assert once.exists()
    assert second.returncode == 0, second.stderr  # the same arrival in a new process: spent


def test_env_passes_on_only_the_fault_variables_that_are_set(monkeypatch, tmp_path):
    monkeypatch.delenv(fault_points.ENV_VAR, raising=False)
    monkeypatch.delenv(fault_points.ONCE_VAR, raising=False)
    assert fault_points.env() == {}
    monkeypatch.setenv(fault_points.ENV_VAR, "explorer_run:2")
    monkeypatch.setenv(fault_points.ONCE_VAR, str(tmp_path / "f"))
    assert fault_points.env() == {fault_points.ENV_VAR: "explorer_run:2", fault_points.ONCE_VAR: str(tmp_path / "f")}


def test_the_write_point_raises_enospc_in_process(monkeypatch):
    monkeypatch.setenv(fault_points.ENV_VAR, "checkpoint_write:1")
    monkeypatch.delenv(fault_points.ONCE_VAR, raising=False)
    monkeypatch.setattr(fault_points, "_seen", {})
    with pytest.raises(OSError) as err:
        fault_points.write("checkpoint_write", "w.safetensors")
    assert err.value.errno == errno.ENOSPC and err.value.filename == "w.safetensors"
