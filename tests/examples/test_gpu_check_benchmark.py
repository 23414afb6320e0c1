"""benchmarks/gpu_check.py in its CPU mode (``--device cpu --tiny``): every section's code runs, in
under a minute, and writes the report a GPU machine's run would write (figures meaningless here)."""

from __future__ import annotations

import json
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))


def test_the_cpu_mode_runs_every_section_and_reports_the_targets(tmp_path):
    out = tmp_path / "gpu_check"
    argv = [sys.executable, str(ROOT / "benchmarks" / "gpu_check.py"), "--device", "cpu", "--tiny", "--out", str(out)]
    proc = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(out.with_suffix(".json").read_text())
    sections = report["sections"]
    assert list(sections) == ["cuda_tests", "bandwidth", "rollout", "train_step", "grpo_run", "parity"]
    assert not [n for n, s in sections.items() if s.get("status") == "failed"]
    tiny = sections["rollout"]["tiny"]
    rows = tiny["rows"] * tiny["new_tokens"]
    for name in ("ours", "generate", "generate_static_compiled", "hf_generate_engine"):
        assert tiny["contenders"][name]["tokens"] == rows, name  # no early stop: every row to the cap
    assert tiny["decode_bound_tokens_per_s"] > 0 and tiny["contenders"]["ours"]["slots"] == tiny["rows"]
    step = sections["train_step"]
    assert abs(step["first_loss"]["ours"] - step["first_loss"]["plain_torch"]) < 1e-4  # the same update
    assert sections["grpo_run"]["steps"] == 2 and sections["grpo_run"]["returncode"] == 0
    assert sections["parity"]["float32"]["close"]
    text = out.with_suffix(".md").read_text()
    assert "| train step >= plain torch at equal work |" in text and "not measured (tiny mode)" in text


def test_junit_counts_read_a_pytest_report(tmp_path):
    from gpu_check_parts import junit_counts

    report = tmp_path / "r.xml"
    suite = ET.Element("testsuite", tests="7", failures="1", errors="1", skipped="2")
    root = ET.Element("testsuites")
    root.append(suite)
    ET.ElementTree(root).write(report)
    assert junit_counts(report) == {"passed": 3, "failed": 1, "skipped": 2, "errors": 1}
    assert junit_counts(tmp_path / "missing.xml")["passed"] == 0
