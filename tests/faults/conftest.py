"""The uninterrupted run every resumed run is compared with (once per session)."""

from __future__ import annotations

from pathlib import Path

import pytest
from _lib.faultlib import STEPS, command, run


@pytest.fixture(scope="session")
def straight(tmp_path_factory) -> Path:
    """The uninterrupted run of ``STEPS`` steps: the oracle of per-step rewards."""
    root = tmp_path_factory.mktemp("straight")
    out = run(command(root, f"trainer.total_steps={STEPS}"))
    assert out.returncode == 0, out.stderr[-3000:]
    return root / "grpo_arith"
