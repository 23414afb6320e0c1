"""Make the shared helper module ``faultlib`` importable under ``--import-mode=importlib``;
the uninterrupted run every resumed run is compared with (once per session)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from faultlib import STEPS, command, run


@pytest.fixture(scope="session")
def straight(tmp_path_factory) -> Path:
    """The uninterrupted run of ``STEPS`` steps: the oracle of per-step rewards."""
    root = tmp_path_factory.mktemp("straight")
    out = run(command(root, f"trainer.total_steps={STEPS}"))
    assert out.returncode == 0, out.stderr[-3000:]
    return root / "grpo_arith"
