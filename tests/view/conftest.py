"""The view's tests make tiny runs with the pipeline tests' helper (``tests/pipeline/tiny_runs.py``), and
a tiny comparison with the compare tests' (``tests/compare/compare_testlib.py``), whose curves
``compare_oracle.py`` computes on its own."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[1] / "pipeline"))
sys.path.insert(0, str(Path(__file__).parents[1] / "compare"))
sys.path.insert(0, str(Path(__file__).parent))  # compare_oracle.py

COMPARED = ("examples/grpo_add2.yaml", "examples/dr_grpo_add2.yaml")


@pytest.fixture(scope="session")
def compare_dir(tmp_path_factory) -> Path:
    """A real ``trinity-like compare`` of two recipes on the tiny model: 2 seeds x 2 steps (about 2 minutes)."""
    from compare_testlib import TINY_SETS, compare, set_flags

    out = tmp_path_factory.mktemp("compare") / "compare_add2"
    done = compare(*COMPARED, "--seeds", "2", *set_flags(TINY_SETS), "--out", str(out), "--jobs", "2")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return out
