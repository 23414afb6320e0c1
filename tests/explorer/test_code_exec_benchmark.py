"""benchmarks/code_exec.py runs as documented (one round, one call): three variants, a table, JSON."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="no bwrap (Debian package bubblewrap)")
def test_code_exec_benchmark_smoke(tmp_path):
    out = tmp_path / "code_exec"
    cmd = [sys.executable, str(ROOT / "benchmarks" / "code_exec.py"), "--ref", "HEAD", "--rounds", "1", "--calls", "1"]
    subprocess.run([*cmd, "--out", str(out)], check=True, cwd=ROOT, capture_output=True, text=True, timeout=300)
    table = out.with_suffix(".md").read_text()
    assert "| before |" in table and "| after |" in table and "| per line |" in table
    result = json.loads(out.with_suffix(".json").read_text())
    assert set(result["median_tasks_per_s"]) == {"before", "after", "per line"}
    assert all(rate > 0 for rate in result["median_tasks_per_s"].values()) and result["cpu"]
