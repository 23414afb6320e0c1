"""Make the shared helper module ``compare_testlib`` importable under ``--import-mode=importlib``."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
