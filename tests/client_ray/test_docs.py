"""docs/client.md's "Running on Ray" snippet runs as written (it starts and stops its own Ray)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_ray_snippet_runs_as_written(tmp_path):
    blocks = re.findall(
        r"^```python\n(.*?)^```", (ROOT / "docs" / "client.md").read_text(), flags=re.DOTALL | re.MULTILINE
    )
    code = next(b for b in blocks if 'backend="ray"' in b)
    result = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "RAY_AUTH_MODE": "disabled"},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    losses, groups = result.stdout.strip().splitlines()[-2:]
    loss, grad_norm = map(float, losses.split())
    assert loss > 0 and grad_norm > 0
    count, peaks = groups.split(" ", 1)
    assert int(count) == 8 and all(0 < int(p) <= 2 for p in re.findall(r"\d+", peaks))
