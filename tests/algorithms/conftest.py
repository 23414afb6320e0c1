"""Make the shared helper module ``algo_testlib`` importable under ``--import-mode=importlib``."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import algorithms  # noqa: E402,F401  (registers the pack, as the entry point does)
