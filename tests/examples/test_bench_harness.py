"""benchmarks/harness.py, the one harness every benchmark runs on: the running order of rounds,
contenders isolated in child processes (a failing one recorded, not fatal to the others),
peak memory sampled from outside, and results written whole."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import harness  # noqa: E402


def test_rounds_alternate_or_rotate_the_order():
    assert harness.orders("abc", 3) == [list("abc"), list("cba"), list("abc")]
    assert harness.orders("abc", 4, rotate=True) == [list("abc"), list("bca"), list("cab"), list("abc")]


def test_interleaved_runs_every_name_every_round_in_that_order():
    calls, seen = [], []

    def run(name: str, rnd: int) -> str:
        calls.append((rnd, name))
        return f"{name}{rnd}"

    def after_round(rnd: int, results: dict) -> None:  # what a script writes after each round
        seen.append((rnd, {k: list(v) for k, v in results.items()}))

    out = harness.interleaved(run, ["x", "y"], 2, after_round=after_round)
    assert calls == [(0, "x"), (0, "y"), (1, "y"), (1, "x")]
    assert out == {"x": ["x0", "x1"], "y": ["y0", "y1"]}
    assert seen[0] == (0, {"x": ["x0"], "y": ["y0"]})


CONTENDER = """
import os, sys, time
sys.path.insert(0, {bench!r})
from harness import contender_main

class Counter:
    def __init__(self, kind):
        if kind == "build-fails":
            raise SystemExit("bad setting: --width must be positive")
        self.kind, self.blob = kind, b"x" * 50_000_000  # 50 MB resident (written, not just mapped)
    def steps(self, count):
        if self.kind == "step-fails":
            raise RuntimeError("boom in step 1")
        if self.kind == "hangs":
            time.sleep(60)
        if self.kind == "dies":
            os._exit(3)  # no JSON, no traceback
        time.sleep(0.6)  # the parent samples memory every 0.25 s
        return [{{"time/step": 0.01 * i}} for i in range(count)]
    def info(self):
        return {{"kind": self.kind}}
    def close(self):
        pass

kind, out = sys.argv[1], sys.argv[2]
contender_main(lambda: Counter(kind), 3, out, name=kind)
"""


@pytest.fixture
def contender(tmp_path):
    script = tmp_path / "contender.py"
    script.write_text(CONTENDER.format(bench=str(ROOT / "benchmarks")))

    def run(kind: str, timeout: float = 60) -> dict:
        out = tmp_path / f"{kind}.json"
        return harness.isolated([sys.executable, str(script), kind, str(out)], out, timeout=timeout)

    return run


def test_a_contender_runs_in_its_own_process_with_its_peak_memory(contender):
    ok = contender("ok")
    assert "error" not in ok
    assert ok["name"] == "ok" and ok["kind"] == "ok" and ok["setup_s"] >= 0
    assert ok["warmup"] == {"time/step": 0.0} and [s["time/step"] for s in ok["steps"]] == [0.01, 0.02]
    assert ok["memory"]["peak_rss_gb"] > 0.05  # the child's 50 MB, seen from outside
    assert ok["wall_s"] > 0 and ok["leftover_processes"] == 0


@pytest.mark.parametrize(
    ("kind", "error"),
    [
        ("build-fails", "SystemExit: bad setting: --width must be positive (exit status 1)"),
        ("step-fails", "RuntimeError: boom in step 1 (exit status 1)"),
        ("dies", "exit status 3"),
    ],
)
def test_a_failing_contender_is_recorded_with_its_error(contender, kind, error):
    result = contender(kind)
    assert result["error"] == error
    assert "steps" not in result and result["wall_s"] > 0


def test_a_contender_past_its_time_is_stopped_and_recorded(contender):
    result = contender("hangs", timeout=3)
    assert result["error"] == "timed out" and result["wall_s"] < 30


def test_results_are_written_whole_as_json_and_markdown(tmp_path):
    table = harness.md_table(["name", "s"], [["a", "1.00"], ["b", "2.00"]])
    assert table == ["| name | s |", "|---|---|", "| a | 1.00 |", "| b | 2.00 |"]
    out = tmp_path / "deep" / "bench"
    harness.write_results(out, {"median_s": {"a": 1.0}}, "# title\n\n" + "\n".join(table) + "\n\n")
    assert json.loads((tmp_path / "deep" / "bench.json").read_text()) == {"median_s": {"a": 1.0}}
    assert (tmp_path / "deep" / "bench.md").read_text() == "# title\n\n" + "\n".join(table) + "\n"
    assert sorted(p.name for p in (tmp_path / "deep").iterdir()) == ["bench.json", "bench.md"]  # no temp file left


def test_the_machine_and_commit_beside_every_figure(tmp_path):
    m = harness.machine()
    assert m["cpus"] == os.cpu_count() and m["cpu"] and m["python"].count(".") == 2
    assert set(m["cpu_flags"]) <= set(harness.NOTABLE_CPU_FLAGS)
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():  # the oracle: the kernel's own flag list
        flags = next(ln for ln in cpuinfo.read_text().splitlines() if ln.startswith("flags")).split(":")[1].split()
        assert m["cpu_flags"] == [f for f in harness.NOTABLE_CPU_FLAGS if f in flags]
    head = subprocess.run(["git", "rev-parse", "--short=7", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    assert harness.git_commit().startswith(head.stdout.strip())
    assert harness.git_commit(tmp_path, missing="no repository") == "no repository"
    assert harness.command("x.py", ["--tiny", "--out", "o"]) == "python benchmarks/x.py --tiny --out o"
    assert harness.command("x.py", ["--set", "a={b: 1}"]) == "python benchmarks/x.py --set 'a={b: 1}'"  # pasteable


def test_the_results_stem_may_name_either_file_and_carry_dots(tmp_path):
    for out in (tmp_path / "a.json", tmp_path / "a.md", tmp_path / "a"):
        assert harness.write_results(out, [1], ["# a", "", "x"]) == "# a\n\nx\n"
    harness.write_results(tmp_path / "qwen2.5", [2])  # no text: no markdown
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.json", "a.md", "qwen2.5.json"]


def test_a_failing_cli_command_exits_naming_its_log(tmp_path):
    with pytest.raises(
        SystemExit, match=r"trinity-like run --config /nonexistent.yaml: exit 2; see .*x\.log:\n.*no such"
    ):
        harness.run_cli(["run", "--config", "/nonexistent.yaml"], tmp_path / "logs" / "x.log")
    assert "no such recipe file" in (tmp_path / "logs" / "x.log").read_text()


def test_a_comma_list_of_contenders_is_checked_against_the_known_ones():
    assert harness.pick("--contenders", " b, a,", ["a", "b", "c"]) == ["b", "a"]
    with pytest.raises(SystemExit, match=r"^--contenders: unknown \['d'\]; choose from a, b$"):
        harness.pick("--contenders", "a,d", ["a", "b"])
    with pytest.raises(SystemExit, match=r"^--variants: unknown empty list"):
        harness.pick("--variants", " , ", ["a"])
