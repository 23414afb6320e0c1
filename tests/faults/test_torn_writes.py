"""A torn write in a run's JSON Lines files: the resumed run cuts it before appending, readers skip damage.

A process killed mid-write leaves a last line without its newline. Before, the resumed run
appended straight after it, gluing its first record to the fragment: `view` and `report`
crashed on the glued line and `plot` silently dropped every step after it. The real run
here is broken the way a kill breaks it (the fragment a half-written line leaves), resumed
with the same command, and read back by the real CLI.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from _lib.faultlib import command, record, run

from trinity_like.monitor.jsonl import JsonlAppender, cut_torn_tail, read_records
from trinity_like.monitor.sinks import read_jsonl_metrics

FRAGMENTS = {  # what a kill mid-write leaves at the end of each file the run appends to
    "metrics.jsonl": '{"step": 3, "time": 17000.5, "reward/mean": 0.2',
    "evals.jsonl": '{"step": 2, "kind": "answer", "task_id": "arith-eval-0-1", "prompt": "What is',
    "timeline.jsonl": '{"actor": "trainer", "phase": "upd',
}


def lines_of(path: Path) -> list[dict]:
    """Every line of ``path`` as JSON: this fails on a glued or torn line."""
    text = path.read_text()
    assert text.endswith("\n")
    return [json.loads(line) for line in text.splitlines()]


def test_a_resumed_run_cuts_the_torn_tail_of_each_log_before_appending(tmp_path: Path, record_property) -> None:
    extra = ("monitor.eval_interval=1",)
    first = run(command(tmp_path, "trainer.total_steps=2", *extra))
    assert first.returncode == 0, first.stderr[-3000:]
    run_dir = tmp_path / "grpo_arith"
    for name, fragment in FRAGMENTS.items():
        with open(run_dir / name, "a") as fh:
            fh.write(fragment)
    resumed = run(command(tmp_path, "trainer.total_steps=3", *extra))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    cuts = [line for line in resumed.stderr.splitlines() if "before appending" in line]
    for name, fragment in FRAGMENTS.items():
        said = [line for line in cuts if f"{run_dir / name}:" in line]
        assert len(said) == 1, (name, resumed.stderr[-3000:])  # once per file, however many appends follow
        assert f"a last line of {len(fragment)} bytes without its newline" in said[0]
        lines_of(run_dir / name)  # nothing glued: every line is a whole record
    assert 3 in {r["step"] for r in lines_of(run_dir / "metrics.jsonl") if "time/rollout" in r}
    assert 3 in {r["step"] for r in lines_of(run_dir / "evals.jsonl")}

    cli = [sys.executable, "-m", "trinity_like.cli"]
    plot = subprocess.run([*cli, "plot", str(run_dir)], capture_output=True, text=True, timeout=120)
    assert plot.returncode == 0 and "warning" not in plot.stderr, plot.stderr
    timeline = subprocess.run([*cli, "plot", "--timeline", str(run_dir)], capture_output=True, text=True, timeout=120)
    assert timeline.returncode == 0 and "warning" not in timeline.stderr, timeline.stderr
    out = tmp_path / "report.html"
    report = subprocess.run(
        [*cli, "report", str(run_dir), "--out", str(out)], capture_output=True, text=True, timeout=120
    )
    assert report.returncode == 0 and "warning" not in report.stderr, report.stderr
    record(
        record_property,
        "a torn last line (a kill mid-write) in metrics.jsonl, evals.jsonl and timeline.jsonl, then the run resumed",
        "the resumed run cut each torn tail once, at its first append, with one line on stderr; every line of each "
        "file is whole; plot, plot --timeline and report read every step without a warning",
        "yes, same command with one more step",
        "not counted by this test",
    )


def test_damage_left_by_an_older_version_is_skipped_and_the_steps_after_it_kept(tmp_path: Path, capsys) -> None:
    """A torn line with the next run's first record glued on (what resuming wrote before this fix)."""
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1, "loss": 1.0}\n{"step": 2, "lo{"step": 2, "loss": 0.5}\n{"step": 3, "loss": 0.25}\n')
    assert [r["step"] for r in read_jsonl_metrics(path, step=True)] == [1, 3]
    assert capsys.readouterr().err == (
        f"trinity-like: warning: {path}:2: not JSON (Expecting ':' delimiter at column 18): line skipped\n"
    )


@pytest.mark.parametrize(
    "tail, cut",
    [
        (b'{"step": 2, "lo', True),  # no newline
        (b'{"step": 2, "lo}\n', True),  # a newline, but not JSON
        (b"[1, 2]\n", True),  # JSON, not an object
        (b'{"step": 2}', True),  # whole, but its newline never written
        (b'{"step": 2}\n', False),
        (b"\n", False),
    ],
)
def test_the_appender_cuts_only_a_torn_tail(tmp_path: Path, tail: bytes, cut: bool, capsys) -> None:
    path = tmp_path / "log.jsonl"
    path.write_bytes(b'{"step": 1}\n' + tail)
    JsonlAppender(path).append([{"step": 3}])
    kept = b'{"step": 1}\n' + (b"" if cut else tail)
    assert path.read_bytes() == kept + b'{"step": 3}\n'
    err = capsys.readouterr().err
    assert err.count("\n") == int(cut) and (not cut or f"{path}:2: cut a last line" in err), err


def test_cut_torn_tail_of_a_file_that_is_one_torn_line(tmp_path: Path) -> None:
    path = tmp_path / "log.jsonl"
    path.write_bytes(b"x" * 200_000)  # longer than the block read back at a time
    cut_torn_tail(path)
    assert path.read_bytes() == b""


APPEND_MANY = """
import sys
from trinity_like.monitor.jsonl import JsonlAppender
who = int(sys.argv[2])
log = JsonlAppender(sys.argv[1], keep_open=who % 2 == 0)
for i in range(200):  # lines of up to 200 KB: a write of many pages, which a reader could see half done
    log.append([{"who": who, "i": i, "pad": "x" * (i * 7919 % 200_000)}])
log.close()
"""


def test_appenders_in_several_processes_never_cut_or_split_each_others_lines(tmp_path: Path) -> None:
    """The split modes' explorer and trainer append to one timeline: under the file lock, a line in
    flight is never taken for a torn tail and cut."""
    path = tmp_path / "shared.jsonl"
    procs = [subprocess.Popen([sys.executable, "-c", APPEND_MANY, str(path), str(w)]) for w in range(4)]
    assert [p.wait(timeout=120) for p in procs] == [0] * 4
    got = read_records(path)
    assert not got.damaged
    assert sorted((r["who"], r["i"]) for _, r in got.records) == [(w, i) for w in range(4) for i in range(200)]


def test_readers_wait_for_a_line_being_written_and_name_damage_by_line(tmp_path: Path) -> None:
    path = tmp_path / "m.jsonl"
    path.write_bytes(b'{"step": 1}\n\nnot json\n{"step": "x"}\n{"step": 2, "v": NaN, "w": 1e999}\n{"step": 3')
    from trinity_like.monitor.jsonl import needs

    got = read_records(path, check=needs({"step": int}), name="m.jsonl")
    assert [(n, r) for n, r in got.records] == [(1, {"step": 1}), (5, {"step": 2, "v": None, "w": None})]
    assert got.messages() == [
        "m.jsonl:3: not JSON (Expecting value at column 1): line skipped",
        'm.jsonl:4: field "step" must be a whole number (got "x"): line skipped',
    ]
    assert got.end == path.stat().st_size - len(b'{"step": 3') and got.next_line == 6
    more = read_records(path, got.end, got.next_line)  # the rest comes once its newline is written
    assert more.records == [] and more.end == got.end
