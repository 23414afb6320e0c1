"""benchmarks/multiturn.py runs as documented (tiny model): both engine variants and generate, a table, JSON."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_multiturn_benchmark_smoke(tmp_path):
    out = tmp_path / "multiturn"
    subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "multiturn.py"),
            "--model",
            "tiny-random",
            "--episodes",
            "4",
            "--turns",
            "3",
            "--rounds",
            "1",
            "--out",
            str(out),
        ],
        check=True,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    table = out.with_suffix(".md").read_text()
    assert "| reuse |" in table and "| reprefill |" in table
    summary = json.loads(out.with_suffix(".json").read_text())["result"]["summary"]
    reuse, reprefill = summary["reuse"], summary["reprefill"]
    assert reprefill["prefilled_tokens"] == reprefill["prompt_tokens"]  # every turn runs the whole history
    assert reuse["prefilled_tokens"] < reuse["prompt_tokens"]  # later turns run only their new tokens
