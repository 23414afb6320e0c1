"""benchmarks/code_exec.py runs as documented (one round, one call): four variants, a table, JSON."""

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
    variants = {"before, 3 lines", "after, 3 lines", "before, 9 lines", "after, 9 lines"}
    assert all(f"| {v} |" in table for v in variants)
    result = json.loads(out.with_suffix(".json").read_text())
    assert set(result["median_tasks_per_s"]) == set(result["median_ms_per_call"]) == variants
    assert all(rate > 0 for rate in result["median_tasks_per_s"].values()) and result["cpu"]
