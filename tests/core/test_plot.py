"""``trinity-like plot`` draws a run's metrics as a PNG."""

from __future__ import annotations

import json
import subprocess
import sys

from trinity_like.monitor.plot import plot_run


def test_plot_writes_a_png_of_the_run(tmp_path):
    rows = [{"step": 0, "eval/accuracy": 0.2, "eval/accuracy_stderr": 0.03}]
    rows += [
        {
            "step": s,
            "reward/mean": s / 10,
            "loss": 0.1,
            "response_length/mean": 12.0,
            "time/step": 3.0,
            "time/rollout": 1.0,
            "time/update": 2.0,
            "throughput/tokens_per_s": 50.0,
        }
        for s in range(1, 6)
    ]
    (tmp_path / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    out = plot_run(tmp_path)
    assert out == tmp_path / "metrics.png"
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 10_000


def test_plot_of_a_folder_without_metrics_is_one_line(tmp_path):
    r = subprocess.run(
        [sys.executable, "-m", "trinity_like.cli", "plot", str(tmp_path)], capture_output=True, text=True
    )
    assert r.returncode == 2 and "no metrics.jsonl" in r.stderr and r.stderr.count("\n") == 1


def test_a_steps_checkpoint_time_logged_on_its_own_line_joins_the_steps_bar():
    import doctest

    import trinity_like.monitor.plot as plot

    assert doctest.testmod(plot).failed == 0
    rows = [
        {"step": 1, "time/step": 2.0, "time/rollout": 0.5},
        {"step": 1, "time/checkpoint": 0.4},
        {"step": 2, "time/step": 1.0, "time/update": 0.7},
    ]
    assert plot.phase_rows(rows) == [
        {"step": 1, "time/step": 2.0, "time/rollout": 0.5, "time/checkpoint": 0.4},
        {"step": 2, "time/step": 1.0, "time/update": 0.7},
    ]


def test_damaged_lines_and_values_too_large_to_draw_are_left_out_with_a_warning(tmp_path):
    """Before: a string phase time was a traceback, 1e308 broke matplotlib's axis, and a torn line
    dropped every step after it."""
    lines = [
        json.dumps({"step": 1, "reward/mean": 0.1, "time/step": 1.0, "time/update": "slow", "loss": True}),
        '{"step": 2, "reward/mean": 0.',  # torn by a kill
        json.dumps({"step": 3, "reward/mean": 1.7e308, "loss": -1.7e308, "time/step": 1.0, "time/update": 0.5}),
        json.dumps(
            {
                "step": 4,
                "reward/mean": 0.4,
                "throughput/tokens_per_s": "fast",
                "eval/accuracy": 0.5,
                "eval/accuracy_stderr": "n/a",
            }
        ),
        "[4, 5]",
    ]
    (tmp_path / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    r = subprocess.run(
        [sys.executable, "-m", "trinity_like.cli", "plot", str(tmp_path)], capture_output=True, text=True
    )
    assert r.returncode == 0 and r.stdout.strip() == str(tmp_path / "metrics.png"), r.stderr
    path = tmp_path / "metrics.jsonl"
    assert r.stderr.splitlines() == [
        f"trinity-like: warning: {path}:2: not JSON (Expecting ',' delimiter at column 29): line skipped",
        f"trinity-like: warning: {path}:5: a JSON list, not an object: line skipped",
        f"trinity-like: warning: {path}: reward/mean: 1 values not drawn (not a number, or beyond +-1e+100)",
        f"trinity-like: warning: {path}: loss: 2 values not drawn (not a number, or beyond +-1e+100)",
        f"trinity-like: warning: {path}: throughput/tokens_per_s: 1 values not drawn (not a number, or beyond +-1e+100)",
    ]
    assert (tmp_path / "metrics.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_out_file_is_checked_before_drawing_and_written_whole(tmp_path):
    (tmp_path / "metrics.jsonl").write_text(json.dumps({"step": 1, "reward/mean": 0.5}) + "\n")

    def plot(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "trinity_like.cli", "plot", str(tmp_path), *args], capture_output=True, text=True
        )

    for args, message in [
        (("--out", str(tmp_path / "m.txt")), "not an image format matplotlib writes"),
        (("--out", str(tmp_path)), "is a folder"),
        (("--out", str(tmp_path / "gone" / "m.png")), "no folder"),
    ]:
        r = plot(*args)
        assert r.returncode == 2 and message in r.stderr and r.stderr.count("\n") == 1, r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["metrics.jsonl"]  # nothing written, no temporary left
    r = plot("--out", str(tmp_path / "m.svg"))
    assert r.returncode == 0 and (tmp_path / "m.svg").read_text().startswith("<?xml")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.svg", "metrics.jsonl"]
