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


@pytest.fixture(scope="session")
def compare_dir(tmp_path_factory) -> Path:
    """A real ``trinity-like compare`` of grpo_add2 and dr_grpo_add2 on the tiny model: 2 seeds x 2 steps,
    the compare tests' own run (made once per test session: ``compare_testlib.tiny_compare``)."""
    from compare_testlib import tiny_compare

    return tiny_compare(tmp_path_factory, "compare")[0]
