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
