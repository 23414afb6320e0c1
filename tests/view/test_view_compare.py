"""What the view reads from a ``trinity-like compare`` folder: per entry the mean curve over seeds and its
95 % band, the verdict lines, its runs; a damaged or hostile ``compare.json`` is a warning, never an error.

The oracle reads each run's ``metrics.jsonl`` with ``json`` and computes the interval with
``scipy.stats.t.interval`` and ``scipy.stats.sem``, not with the comparison's own statistics.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from _lib.compare_oracle import oracle

from trinity_like.compare.report import OK
from trinity_like.errors import TrinityError
from trinity_like.view import compare as view_compare
from trinity_like.view.compare import FINISHED, comparisons_data, open_comparison, open_folders
from trinity_like.view.report import write_report
from trinity_like.view.server import build_app


def drawn(data: dict, key: str) -> dict[str, dict[int, tuple]]:
    (panel,) = [p for p in data["panels"] if p["key"] == key]
    return {
        e["label"]: {s: (m, lo, hi, n) for s, m, lo, hi, n in zip(e["steps"], e["mean"], e["low"], e["high"], e["n"])}
        for e in panel["entries"]
    }


def assert_same(got: dict, want: dict) -> None:
    assert got.keys() == want.keys()
    for label in want:
        assert got[label].keys() == want[label].keys(), label
        for step, (mean, low, high, n) in want[label].items():
            g = got[label][step]
            assert g[0] == pytest.approx(mean, abs=1e-12) and g[3] == n, (label, step)
            for x, y in ((g[1], low), (g[2], high)):
                assert (x is None and y is None) or x == pytest.approx(y, abs=1e-9), (label, step)


def test_each_entry_is_its_runs_mean_with_the_t_interval(compare_dir):
    runs, comparisons = open_folders([str(compare_dir)])
    assert [r.name for r in runs] == [
        "grpo_add2/seed_0",
        "grpo_add2/seed_1",
        "dr_grpo_add2/seed_0",
        "dr_grpo_add2/seed_1",
    ]
    (data,) = comparisons_data(runs, comparisons)
    assert data["warnings"] == [] and data["baseline"] == "grpo_add2" and data["seeds"] == [0, 1]
    for key in ("eval/accuracy", "reward/mean"):
        want = oracle(compare_dir, key)
        assert all(len(steps) == 2 for steps in want.values()), want  # evaluations at 0 and 2; rewards at 1 and 2
        assert_same(drawn(data, key), want)
    report = json.loads((compare_dir / "compare.json").read_text())
    for entry in data["entries"]:
        assert [runs[i].path for i in entry["runs"]] == [
            compare_dir / "runs" / entry["label"] / f"seed_{s}" for s in (0, 1)
        ]
        assert entry["lines"] == [b["line"] for b in report["comparisons"].get(entry["label"], [])]
    assert data["entries"][1]["lines"] and FINISHED == OK


def test_a_step_redone_after_a_resume_counts_once_and_a_failed_run_is_left_out(compare_dir, tmp_path):
    folder = tmp_path / "cmp"
    shutil.copytree(compare_dir, folder)
    metrics = folder / "runs" / "dr_grpo_add2" / "seed_1" / "metrics.jsonl"
    with metrics.open("a") as fh:  # killed after step 2, resumed from step 1's checkpoint: step 2 logged again
        fh.write(json.dumps({"step": 2, "time/step": 1.0, "reward/mean": 0.875}) + "\n")
    report = json.loads((folder / "compare.json").read_text())
    report["runs"][0]["status"] = "failed"  # grpo_add2/seed_0
    (folder / "compare.json").write_text(json.dumps(report))
    runs, comparisons = open_folders([str(folder)])
    assert [r.name for r in runs] == ["grpo_add2/seed_1", "dr_grpo_add2/seed_0", "dr_grpo_add2/seed_1"]
    (data,) = comparisons_data(runs, comparisons)
    want = oracle(folder, "reward/mean")
    assert want["dr_grpo_add2"][2][0] == pytest.approx((_seed_reward(folder, "dr_grpo_add2", 0, 2) + 0.875) / 2)
    assert want["grpo_add2"][1][3] == 1
    assert_same(drawn(data, "reward/mean"), want)


def _seed_reward(folder: Path, label: str, seed: int, step: int) -> float:
    rows = [json.loads(x) for x in (folder / "runs" / label / f"seed_{seed}" / "metrics.jsonl").open()]
    return [r["reward/mean"] for r in rows if r["step"] == step and "reward/mean" in r][-1]


def test_the_api_and_the_report_carry_the_comparison_beside_other_runs(compare_dir, tmp_path):
    from fastapi.testclient import TestClient

    other = tmp_path / "other"
    other.mkdir()
    (other / "metrics.jsonl").write_text(json.dumps({"step": 1, "reward/mean": 0.5}) + "\n")
    runs, comparisons = open_folders([str(other), str(compare_dir)])
    assert [r.name for r in runs][:2] == ["other", "grpo_add2/seed_0"]
    with TestClient(build_app(runs, comparisons=comparisons)) as client:
        got = client.get("/api/compares")
        assert got.status_code == 200
        (data,) = got.json()
        assert [e["runs"] for e in data["entries"]] == [[1, 2], [3, 4]]
        assert_same(drawn(data, "reward/mean"), oracle(compare_dir, "reward/mean"))
        assert [r["name"] for r in client.get("/api/runs").json()][1:] == [runs[i].name for i in range(1, 5)]
    out = write_report([str(other), str(compare_dir)], tmp_path / "r.html")
    page = out.read_text()
    start = page.index("window.REPORT = ") + len("window.REPORT = ")
    embedded = json.loads(page[start : page.index(";</script>", start)])
    assert embedded["compares"][0]["entries"] == data["entries"]
    assert_same(drawn(embedded["compares"][0], "eval/accuracy"), oracle(compare_dir, "eval/accuracy"))


HOSTILE = [
    ("{", "not valid JSON"),
    ("[" * 100_000 + "]" * 100_000, "not valid JSON"),
    ("[1, 2]", "a JSON list, not a comparison's report"),
    ('{"entries": 5}', "entries must be a list"),
]


@pytest.mark.parametrize(("text", "message"), HOSTILE)
def test_a_damaged_compare_json_is_one_warning_and_an_empty_comparison(compare_dir, tmp_path, text, message):
    from fastapi.testclient import TestClient

    folder = tmp_path / "cmp"
    shutil.copytree(compare_dir, folder)
    (folder / "compare.json").write_text(text)
    runs, comparisons = open_folders([str(folder)])
    assert runs == [] and len(comparisons[0].warnings) == 1 and message in comparisons[0].warnings[0]
    with TestClient(build_app(runs, comparisons=comparisons)) as client:
        got = client.get("/api/compares")
        assert got.status_code == 200 and got.json()[0]["warnings"] == comparisons[0].warnings
        assert got.json()[0]["entries"] == [] and client.get("/api/runs").json() == []


def test_a_compare_json_too_large_is_not_read(compare_dir, tmp_path, monkeypatch):
    monkeypatch.setattr(view_compare, "MAX_COMPARE_BYTES", 100)
    c = open_comparison(compare_dir)
    assert c.labels == [] and len(c.warnings) == 1 and "not a comparison's report; not shown" in c.warnings[0]


def test_a_hostile_compare_json_never_leads_out_of_its_folder(compare_dir, tmp_path):
    folder = tmp_path / "cmp"
    shutil.copytree(compare_dir, folder)
    secret = tmp_path / "elsewhere"
    shutil.copytree(compare_dir / "runs" / "grpo_add2" / "seed_0", secret)
    report = json.loads((folder / "compare.json").read_text())
    report["entries"].append({"label": ".."})
    report["entries"].append({"label": "../../x"})
    runs = report["runs"]
    runs[0]["run_dirs"] = ["../../../../elsewhere"]  # grpo_add2/seed_0
    runs[1]["run_dirs"] = [str(secret)]  # grpo_add2/seed_1: absolute
    runs[2]["seed"] = "0"  # dr_grpo_add2/seed_0
    runs.append({"label": "..", "seed": 0, "status": "done", "run_dirs": ["."]})
    (folder / "compare.json").write_text(json.dumps(report))
    shutil.rmtree(folder / "runs" / "dr_grpo_add2" / "seed_1")
    os.symlink(secret, folder / "runs" / "dr_grpo_add2" / "seed_1")  # a link out of the folder
    c = open_comparison(folder)
    where = f"{folder / 'compare.json'}"
    assert c.labels == ["grpo_add2", "dr_grpo_add2"] and c.members == []
    assert (
        c.warnings
        == [
            f"{where}: entries.2: needs a label that names a folder (letters, digits, _ . + -)",
            f"{where}: entries.3: needs a label that names a folder (letters, digits, _ . + -)",
            f"{where}: runs.0: '../../../../elsewhere' leads out of {folder}; not read",
            f"{where}: runs.1: run_dirs must be paths inside the run's folder (got {json.dumps(str(secret))[:80]}); not read",  # at most 80 characters of it
            f"{where}: runs.2: needs the label of an entry, a whole-number seed and a status; skipped",
            f"{where}: runs.3: '.' leads out of {folder}; not read",
            f"{where}: runs.4: needs the label of an entry, a whole-number seed and a status; skipped",
        ]
    )
    data = comparisons_data([], [c])[0]
    assert all(e["steps"] == [] for p in data["panels"] for e in p["entries"])


def test_a_run_listed_twice_is_drawn_once_and_an_older_compare_json_reads_the_default_places(compare_dir, tmp_path):
    folder = tmp_path / "cmp"
    shutil.copytree(compare_dir, folder)
    report = json.loads((folder / "compare.json").read_text())
    del report["keys"]  # written before compare.json kept them: the default keys, each run's own folder
    for r in report["runs"]:
        del r["run_dirs"]
    report["runs"].append(report["runs"][0])  # grpo_add2/seed_0 again
    (folder / "compare.json").write_text(json.dumps(report))
    runs, comparisons = open_folders([str(folder)])
    assert comparisons[0].warnings == [
        f"{folder / 'compare.json'}: runs.4: grpo_add2/seed_0 is listed twice; the first is drawn"
    ]
    assert len(runs) == 4
    assert_same(drawn(comparisons_data(runs, comparisons)[0], "reward/mean"), oracle(compare_dir, "reward/mean"))


def test_a_missing_run_folder_and_a_damaged_metrics_line_are_warned_and_the_rest_drawn(compare_dir, tmp_path):
    folder = tmp_path / "cmp"
    shutil.copytree(compare_dir, folder)
    shutil.rmtree(folder / "runs" / "grpo_add2" / "seed_1")
    metrics = folder / "runs" / "dr_grpo_add2" / "seed_0" / "metrics.jsonl"
    lines = metrics.read_text().splitlines()
    metrics.write_text("\n".join([lines[0], '{"step": 1, "reward/mean": 0.', *lines[1:]]) + "\n")
    runs, comparisons = open_folders([str(folder)])
    c = comparisons[0]
    assert len(c.warnings) == 1 and "runs.1 (grpo_add2/seed_1)" in c.warnings[0] and "no such folder" in c.warnings[0]
    (data,) = comparisons_data(runs, comparisons)
    assert any(f"{metrics}:2: not JSON" in w for r in runs for w in r.warnings)
    want = oracle(folder, "reward/mean")
    assert want["grpo_add2"][1][3] == 1 and want["dr_grpo_add2"][1][3] == 2
    assert_same(drawn(data, "reward/mean"), want)


def test_the_command_line_opens_a_comparison_and_says_so(compare_dir, tmp_path):
    r = subprocess.run(
        [sys.executable, "-m", "trinity_like.cli", "report", str(compare_dir), "--out", str(tmp_path / "c.html")],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0 and r.stderr == "", r.stderr
    (tmp_path / "notacompare").mkdir()
    r = subprocess.run(
        [sys.executable, "-m", "trinity_like.cli", "view", str(tmp_path / "notacompare")],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 2 and "nor a comparison (no compare.json)" in r.stderr and r.stderr.count("\n") == 1
    with pytest.raises(TrinityError, match="no such folder"):
        open_folders([str(tmp_path / "missing")])
