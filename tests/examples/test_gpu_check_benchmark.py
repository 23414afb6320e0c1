"""benchmarks/gpu_check.py in its CPU mode (``--device cpu --tiny``): every section's code runs and
writes the report a GPU machine's run would write (figures meaningless here); a raising, a hung
and a crashing entry cost only themselves; ``--only`` runs any section alone; a check killed
mid-run leaves every entry it finished on disk, whole."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from _lib.scripts import load_script

ROOT = Path(__file__).resolve().parents[2]
CHECK = [sys.executable, str(ROOT / "benchmarks" / "gpu_check.py"), "--device", "cpu", "--tiny"]
SECTIONS = ["where_time", "parity", "cuda_tests", "bandwidth", "rollout", "train_step", "grpo_run"]


def run_check(out: Path, *extra: str, env: dict | None = None, timeout: float = 900) -> subprocess.CompletedProcess:
    argv = [*CHECK, "--out", str(out), *extra]
    return subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=timeout, env=env)


def test_the_cpu_mode_runs_every_section_and_reports_the_targets(tmp_path):
    out = tmp_path / "gpu_check"
    proc = run_check(out)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads(out.with_suffix(".json").read_text())
    sections = report["sections"]
    assert list(sections) == SECTIONS == list(report["meta"]["plan_s"])
    assert not [n for n, s in sections.items() if s.get("status") == "failed"]
    assert report["meta"]["wall_s"] <= report["meta"]["budget_s"]
    rollout = sections["rollout"]["entries"]
    tiny = rollout["tiny/workload"]
    for name in ("ours", "generate", "generate_static_compiled", "hf_generate_engine"):
        assert rollout[f"tiny/{name}"]["tokens"] == tiny["rows"] * tiny["new_tokens"], name  # no early stop
    assert tiny["decode_bound_tokens_per_s"] > 0 and rollout["tiny/ours"]["slots"] == tiny["rows"]
    assert tiny["bandwidth_from"] == "the bandwidth section"
    step = sections["train_step"]["entries"]["tiny"]
    assert abs(step["first_loss"]["ours"] - step["first_loss"]["plain_torch"]) < 1e-4  # the same update
    run = sections["grpo_run"]["entries"]["tiny"]
    assert run["steps"] == 2 and run["returncode"] == 0
    parity = sections["parity"]["entries"]
    assert parity["float32"]["close"] and parity["cpu_reference"]["cpu_float32_errors"]["update"] > 0
    where = sections["where_time"]["entries"]
    assert where["tiny/attention"]["prefill"]["backends"]["math"] == "accepts"  # the CPU's own kernel
    assert where["tiny/profile"]["aten_ops_top_level"] > 10 and where["tiny/profile"]["step_ms"] > 0
    tests = sections["cuda_tests"]["entries"]["test_cuda"]  # run on the CPU too: every test skips there
    assert tests["returncode"] == 0 and tests["skipped"] > 0 and tests["passed"] == 0
    ops = where["tiny/step_ops"]  # trinity_like.explorer.step_ops, where the tree has it
    assert ops.get("total", 0) > 0 or "trinity_like.explorer.step_ops" in ops["error"]
    cpu_ops = where["smollm2-135m/step_ops_cpu"]  # the 30-layer shape, counted on the CPU in every mode
    assert cpu_ops["rows"] == 64 and 0 < cpu_ops["kernels"] < cpu_ops["total"]
    text = out.with_suffix(".md").read_text()
    assert "| train step >= plain torch at equal work |" in text and "not measured (tiny mode)" in text
    assert (
        "smollm2-135m's shape on the CPU" in text
        and "operations per decode step" in text
        and "| where_time | 225 |" in text
    )  # the plan, in the report


def test_a_raising_a_hanging_and_a_crashing_contender_cost_only_their_own_entries(tmp_path):
    """``--only rollout`` (no bandwidth section before it) with one contender raising, two hung --
    ours in the section's process, the compiled one in its own -- and one killing its process:
    each is recorded with its error, every other entry is measured."""
    out = tmp_path / "gpu_check"
    faults = {
        "rollout/tiny/generate": "raise",
        "rollout/tiny/ours": "hang",
        "rollout/tiny/hf_generate_engine": "exit",
        "rollout/tiny/generate_static_compiled": "hang",
    }
    env = {**os.environ, "GPU_CHECK_FAULT": ",".join(f"{k}={v}" for k, v in faults.items())}
    proc = run_check(out, "--only", "rollout", "--limit-scale", "0.2", env=env)
    assert proc.returncode == 1, proc.stderr[-3000:]  # failed entries make the check fail
    report = json.loads(out.with_suffix(".json").read_text())
    entries = report["sections"]["rollout"]["entries"]
    assert entries["tiny/generate"]["status"] == "failed" and "fault injected" in entries["tiny/generate"]["error"]
    assert entries["tiny/ours"]["status"] == "timeout" and "killed after" in entries["tiny/ours"]["error"]
    compiled = entries["tiny/generate_static_compiled"]
    assert compiled["status"] == "timeout" and "its own process's limit" in compiled["error"]
    crashed = entries["tiny/hf_generate_engine"]
    assert crashed["status"] == "failed" and "exited with -9" in crashed["error"]
    workload = entries["tiny/workload"]  # measured before them, and kept
    assert workload["bandwidth_from"].startswith("measured by this section") and workload["rows"] == 16
    assert report["sections"]["rollout"]["failed_entries"] == [
        f"tiny/{n}" for n in ("ours", "generate", "hf_generate_engine", "generate_static_compiled")
    ]
    text = out.with_suffix(".md").read_text()
    assert "## rollout: FAILED" in text and "`tiny/ours` timeout: killed after" in text
    assert "`tiny/generate` failed: RuntimeError: fault injected" in text
    assert "| `generate`, static cache + `torch.compile` (own process) | - | - | - | - | timeout |" in text


@pytest.mark.parametrize("section", [s for s in SECTIONS if s != "rollout"])  # rollout alone: the test above
def test_only_runs_any_section_alone(tmp_path, section):
    out = tmp_path / "gpu_check"
    proc = run_check(out, "--only", section)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads(out.with_suffix(".json").read_text())
    assert list(report["sections"]) == [section]
    (result,) = report["sections"].values()
    assert result["entries"] and "status" not in result, result


def test_a_check_killed_mid_run_leaves_its_finished_entries_whole(tmp_path):
    """SIGKILL to the check while an entry hangs: the JSON parses and holds every entry finished
    before, the markdown shows them, and the section's process died with the check."""
    out = tmp_path / "gpu_check"
    env = {**os.environ, "GPU_CHECK_FAULT": "where_time/tiny/step_ops=hang"}
    argv = [*CHECK, "--out", str(out), "--only", "where_time", "parity"]
    proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    report_path, deadline = out.with_suffix(".json"), time.monotonic() + 300
    try:
        while time.monotonic() < deadline:
            done = json.loads(report_path.read_text()) if report_path.is_file() else {"sections": {}}
            if len(done["sections"].get("where_time", {}).get("entries", {})) == 3:  # all but the hung one
                break
            assert proc.poll() is None, "the check ended before the hung entry"
            time.sleep(0.5)
        else:
            pytest.fail("the entries before the hung one never finished")
        time.sleep(1.0)  # the hung entry has started: the kill lands mid-entry
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    report = json.loads(report_path.read_text())
    entries = report["sections"]["where_time"]["entries"]
    assert set(entries) == {"tiny/attention", "tiny/graph", "tiny/profile"} and "parity" not in report["sections"]
    assert entries["tiny/profile"]["aten_ops_top_level"] > 0
    text = out.with_suffix(".md").read_text()
    assert "aten operations at the top level" in text and "| parity | 45 | - | - | not started |" in text
    events = sorted((tmp_path / "gpu_check_logs").glob("where_time-*.jsonl"))
    size = events[-1].stat().st_size
    time.sleep(2.0)
    assert events[-1].stat().st_size == size and not list(tmp_path.glob(".gpu_check.*.tmp"))
    assert not _alive(events[-1])


def _alive(events: Path) -> bool:
    """Whether a process still runs with this events file on its command line (the section's child)."""
    for status in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if str(events) in status.read_bytes().decode(errors="replace"):
                return True
        except OSError:
            continue
    return False


def test_a_section_gets_its_plan_plus_what_earlier_ones_left_within_the_budget():
    gpu_check = load_script("benchmarks/gpu_check.py")

    now = time.monotonic()
    plan = gpu_check.PLAN_S
    assert gpu_check.section_limits("parity", now, 360, {}, 1.0) == plan["parity"]
    spent = {"where_time": plan["where_time"] - 40}  # where_time left 40 s unused: parity may use them
    assert gpu_check.section_limits("parity", now, 360, spent, 1.0) == plan["parity"] + 40
    assert gpu_check.section_limits("rollout", now - 350, 360, {}, 1.0) == pytest.approx(
        9.0, abs=0.1
    )  # no max(30, left)


def test_sections_past_the_budget_are_skipped_with_the_reason(tmp_path):
    out = tmp_path / "gpu_check"
    proc = run_check(out, "--only", "bandwidth", "parity", "--budget-s", "2")
    assert proc.returncode == 0, proc.stderr[-2000:]
    sections = json.loads(out.with_suffix(".json").read_text())["sections"]
    assert [s["status"][:30] for s in sections.values()] == ["skipped: the budget is spent ("] * 2


def test_junit_counts_read_a_pytest_report(tmp_path):
    from gpu_check_parts import junit_counts

    report = tmp_path / "r.xml"
    suite = ET.Element("testsuite", tests="7", failures="1", errors="1", skipped="2")
    root = ET.Element("testsuites")
    root.append(suite)
    ET.ElementTree(root).write(report)
    assert junit_counts(report) == {"passed": 3, "failed": 1, "skipped": 2, "errors": 1}
    assert junit_counts(tmp_path / "missing.xml")["passed"] == 0
