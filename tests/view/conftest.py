"""The view's tests make tiny runs with the pipeline tests' helper (``tests/_lib/tiny_runs.py``), and
a tiny comparison with the compare tests' (``tests/_lib/compare_testlib.py``), whose curves
``tests/_lib/compare_oracle.py`` computes on its own."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def compare_dir(tmp_path_factory) -> Path:
    """A real ``trinity-like compare`` of grpo_add2 and dr_grpo_add2 on the tiny model: 2 seeds x 2 steps,
    the compare tests' own run (made once per test session: ``compare_testlib.tiny_compare``)."""
    from _lib.compare_testlib import tiny_compare

    return tiny_compare(tmp_path_factory, "compare")[0]
