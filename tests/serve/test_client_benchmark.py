"""benchmarks/client.py --compare http runs (the tiny model, one round): the SDK over HTTP and
the in-process client do the same work -- the same tokens sampled from the same weights."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_http_vs_in_process_benchmark_does_equal_work_and_reports(tmp_path):
    out = tmp_path / "client_http"
    argv = [
        sys.executable,
        str(ROOT / "benchmarks" / "client.py"),
        "--compare",
        "http",
        "--model",
        "tiny-random",
        "--reps",
        "2",
        "--prompts",
        "2",
        "--group",
        "4",
        "--max-tokens",
        "4",
        "--out",
        str(out),
    ]
    done = subprocess.run(argv, check=False, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    result = json.loads(out.with_suffix(".json").read_text())
    assert result["same_samples"] == [True, True, True]  # the warm-up round and both timed rounds
    for side in ("in-process", "http"):
        rounds = result["phases"][side]
        assert len(rounds) == 2
        assert all(r["iteration"] >= r["sample"] + r["train"] > 0 for r in rounds)
    assert result["median_ratio"] > 0
    assert "HTTP adds" in out.with_suffix(".md").read_text()
