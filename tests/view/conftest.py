"""The view's tests make tiny runs with the pipeline tests' helper (``tests/pipeline/tiny_runs.py``)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1] / "pipeline"))
