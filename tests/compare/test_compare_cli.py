"""``trinity-like compare`` end to end on the tiny model: runs, report, reuse, a changed plan, failures, resume."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from _lib.compare_testlib import ROOT, TINY_SETS, compare, doc_commands, metrics, report, set_flags, tiny_compare

from trinity_like.compare.stats import paired

A, B = "examples/grpo_add2.yaml", "examples/dr_grpo_add2.yaml"


@pytest.fixture(scope="module")
def done(tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    """docs/compare.md's first command, as written, shrunk to the tiny model and 2 seeds (compare_testlib)."""
    out, result = tiny_compare(tmp_path_factory, "cmp")
    assert doc_commands()[0][:4] == ["trinity-like", "compare", A, B]
    return out, result


def test_every_run_finishes_and_the_report_pairs_them_by_seed(done):
    out, result = done
    rep = report(out)
    assert rep["all_finished"] and rep["baseline"] == "grpo_add2" and rep["seeds"] == [0, 1]
    assert [(r["key"], r["status"]) for r in rep["runs"]] == [
        ("grpo_add2/seed_0", "done"),
        ("grpo_add2/seed_1", "done"),
        ("dr_grpo_add2/seed_0", "done"),
        ("dr_grpo_add2/seed_1", "done"),
    ]
    assert [d["key"] for d in rep["plan_diff"]] == [
        "algorithm.type",
        "resolved.advantage.norm_by_std",
        "resolved.policy_loss.loss_agg_mode",
    ]
    # each run's figures are its metrics.jsonl's, read here independently
    for r in rep["runs"]:
        lines = metrics(out / "runs" / r["label"] / f"seed_{r['seed']}" / "metrics.jsonl")
        evals = [x["eval/accuracy"] for x in lines if "eval/accuracy" in x]
        assert r["result"]["accuracy"] == evals[-1] and r["result"]["accuracy_start"] == evals[0]
        assert r["result"]["rows"] == sum(x["perf/train_rows"] for x in lines if "perf/train_rows" in x)
        assert r["result"]["tokens"] == sum(x["perf/train_tokens"] for x in lines if "perf/train_tokens" in x)
        assert r["result"]["steps"] == 2 and r["result"]["wall_s"] > 0
        assert (out / "logs" / f"{r['label']}_seed{r['seed']}.log").is_file()
    # the paired difference is the runs' own, seed by seed
    by = {(r["label"], r["seed"]): r["result"] for r in rep["runs"]}
    expect = paired(
        [by["grpo_add2", s]["signal_end"] for s in (0, 1)], [by["dr_grpo_add2", s]["signal_end"] for s in (0, 1)]
    )
    (acc, sig) = rep["comparisons"]["dr_grpo_add2"]
    assert acc["metric"] == "held-out answer accuracy at the end" and acc["seeds"] == [0, 1]
    assert sig["mean"] == pytest.approx(expect.mean) and sig["low"] == expect.low
    md = (out / "compare.md").read_text()
    assert md.startswith("# Comparison: grpo_add2 vs dr_grpo_add2 (baseline: grpo_add2)")
    assert "| `resolved.advantage.norm_by_std` | true | false |" in md
    assert f"- {sig['line']}" in md and sig["line"] in result.stdout
    assert (out / "compare.png").stat().st_size > 10_000
    assert "2 run(s) at a time x 1 torch thread(s)" in result.stdout or "run(s) at a time" in result.stdout


def test_no_run_reports_what_finished_and_starts_nothing(done):
    out, _ = done
    more = compare(
        A, B, "--seeds", "3", *set_flags(TINY_SETS), "--out", str(out), "--no-run", "--report", str(out / "so_far")
    )
    assert more.returncode == 1  # seed 2 has not run
    rep = json.loads((out / "so_far.json").read_text())
    assert [(r["key"], r["status"]) for r in rep["runs"] if r["seed"] == 2] == [
        ("grpo_add2/seed_2", "not run"),
        ("dr_grpo_add2/seed_2", "not run"),
    ]
    assert {r["status"] for r in rep["runs"] if r["seed"] < 2} == {"reused"}
    assert not (out / "runs" / "grpo_add2" / "seed_2").exists() and ": started (" not in more.stdout
    assert (out / "so_far.md").is_file() and (out / "so_far.png").is_file()
    assert [c["seeds"] for c in rep["comparisons"]["dr_grpo_add2"]][0] == [0, 1]


def test_a_second_call_reuses_every_finished_run_and_redoes_a_changed_one(done):
    out, _ = done  # a copy of a comparison made in another folder: its runs are reused where they now are
    again = compare(A, B, "--seeds", "2", *set_flags(TINY_SETS), "--out", str(out))
    assert again.returncode == 0, again.stderr[-3000:]
    assert again.stdout.count("finished before with the same plan: reused") == 4
    assert ": started (" not in again.stdout
    assert {r["status"] for r in report(out)["runs"]} == {"reused"}
    # the second entry now names another recipe under the same label: its runs are stale, the baseline's are not
    changed = compare(
        A, "dr_grpo_add2=examples/grpo_mul1.yaml", "--seeds", "2", *set_flags(TINY_SETS), "--out", str(out)
    )
    assert changed.returncode == 0, changed.stderr[-3000:]
    rep = report(out)
    assert [r["status"] for r in rep["runs"]] == ["reused", "reused", "done", "done"]
    assert changed.stdout.count("its plan changed since it ran; the old run moved to") == 2
    stale = sorted((out / "stale" / "dr_grpo_add2").iterdir())
    assert len(stale) == 2 and all((s / f"{s.name.split('-')[0]}.json").is_file() for s in stale)
    assert "buffer.tasks.generator" in {d["key"] for d in rep["plan_diff"]}


def test_a_bad_recipe_and_a_crashing_seed_are_reported_and_the_rest_runs(tmp_path):
    listing = tmp_path / "listing.yaml"
    listing.write_text(
        f"runs:\n  - recipe: {ROOT / A}\n    label: base\n"
        f"  - recipe: {ROOT / A}\n    label: typo\n    set: [trainer.optimizer.lrr=1.0e-4]\n"
    )
    flaky = f"flaky={sys.executable} tests/compare/flaky_loop.py --seed {{seed}} --log-path {{run_dir}} --fail-seed 1"
    out = tmp_path / "out"
    result = compare(str(listing), "--script", flaky, "--seeds", "2", *set_flags(TINY_SETS), "--out", str(out))
    assert result.returncode == 1, result.stderr[-3000:]
    assert result.stderr == ""
    runs = {r["key"]: r for r in report(out)["runs"]}
    assert runs["base/seed_0"]["status"] == runs["base/seed_1"]["status"] == "done"
    for seed in (0, 1):
        bad = runs[f"typo/seed_{seed}"]
        assert bad["status"] == "invalid" and bad["command"] is None
        assert bad["message"].startswith(f"{listing}: runs.1: ") and "lrr" in bad["message"]
    assert runs["flaky/seed_0"]["status"] == "done"
    crashed = runs["flaky/seed_1"]
    assert crashed["status"] == "failed" and crashed["message"] == "exit 1: seed 1: the loss diverged at step 1"
    assert "flaky/seed_1: failed: exit 1: seed 1: the loss diverged at step 1" in result.stdout
    (acc, *_) = report(out)["comparisons"]["flaky"]
    assert acc["seeds"] == [0] and "no verdict" in acc["verdict"]
    assert report(out)["comparisons"]["typo"] == []


def test_an_interrupted_comparison_resumes_its_runs_from_their_checkpoints(tmp_path):
    out = tmp_path / "out"
    args = [A, B, "--seeds", "1", *set_flags([*TINY_SETS, "trainer.total_steps=4", "checkpoint.interval=1"])]
    args += ["--out", str(out), "--jobs", "1"]
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "HF_HUB_OFFLINE": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "trinity_like.cli", "compare", *args],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        text=True,
        # Ctrl-C as at a terminal, even where this test runs in the background (which ignores SIGINT)
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    first = out / "runs" / "grpo_add2" / "seed_0"
    deadline = time.monotonic() + 600
    while not (first / "checkpoints" / "step_000002").is_dir():
        assert proc.poll() is None and time.monotonic() < deadline, "the first run never reached its step-2 checkpoint"
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    proc.communicate(timeout=300)
    assert proc.returncode == 130
    state = (out / "runs" / "grpo_add2" / "seed_0.json").read_text()
    assert '"status": "failed"' in state
    resumed = compare(*args)
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    rep = report(out)
    assert [(r["key"], r["status"], r["attempts"]) for r in rep["runs"]] == [
        ("grpo_add2/seed_0", "done", 2),
        ("dr_grpo_add2/seed_0", "done", 1),
    ]
    lines = metrics(first / "metrics.jsonl")
    trained = [x["step"] for x in lines if "time/step" in x]
    assert trained[-1] == 4 and sorted(set(trained)) == [1, 2, 3, 4]
    assert sum(1 for x in lines if x["step"] == 0) == 1  # resumed from a checkpoint, never started over
    assert rep["runs"][0]["result"]["steps"] == 4


def test_bad_arguments_are_one_line(tmp_path):
    for args, words in [
        ((A,), "at least two"),
        ((A, B, "--seeds", "0"), "--seeds must be at least 1"),
        ((A, B, "--set", "seed=3"), "--set seed: compare sets it on every run"),
        ((A, "examples/nope.yaml"), "no such file"),
    ]:
        result = compare(*args, "--out", str(tmp_path))
        assert result.returncode == 2 and result.stdout == ""
        assert result.stderr.count("\n") == 1 and words in result.stderr, result.stderr
