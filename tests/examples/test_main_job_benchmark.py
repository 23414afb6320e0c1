"""benchmarks/main_job.py runs as the README shows it (the main job shrunk to the tiny model)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SMALL = [
    "model.path=tiny-random",
    "trainer.engine=local",
    "trainer.total_steps=2",
    "buffer.eval_tasks.size=4",
    "explorer.batch_size=2",
    "explorer.group_size=2",
    "checkpoint.interval=2",
]


def test_main_job_benchmark_reports_memory_and_phases_per_variant(tmp_path):
    out = tmp_path / "main_job"
    argv = [
        sys.executable,
        str(ROOT / "benchmarks" / "main_job.py"),
        "--out",
        str(out),
        "--variant",
        "default:",
        "--variant",
        "checkpointing:trainer.gradient_checkpointing=true",
    ]
    argv += [a for s in SMALL for a in ("--set", s)]
    subprocess.run(argv, check=True, cwd=ROOT, capture_output=True, text=True, timeout=600)
    results = json.loads(out.with_suffix(".json").read_text())["results"]
    assert [r["label"] for r in results] == ["default", "checkpointing"]
    for r in results:
        assert r["peak_pss_gb"] > 0.1 and r["peak_rss_gb"] >= r["peak_pss_gb"]
        assert r["memory_total_gb_median"] > 0 and len(r["rewards"]) == 2 and r["eval_end"] is not None
    assert results[0]["rewards"] == results[1]["rewards"]  # recomputation changes memory, not results
    assert "| checkpointing | `" in out.with_suffix(".md").read_text()
