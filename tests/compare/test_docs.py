"""docs/compare.md runs as written: its commands (shrunk to the tiny model by appended flags), its listing,
the output it shows. Its first command is run by tests/compare/test_compare_cli.py's fixture."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest
from _lib.compare_testlib import ROOT, TINY_SETS, compare, doc_blocks, doc_commands, report

from trinity_like.buffer.task_sources import task_source

# a client loop shrunk to seconds: rl_env.py's own flags, appended inside each --script command
TINY_LOOP = "--model tiny-random --iterations 2 --batch 2 --group 2 --eval 4 --eval-every 1"


def test_every_command_the_doc_shows_is_one_these_tests_run():
    """compare and run here and in test_compare_cli.py, view and report in tests/view/test_docs.py."""
    for argv in doc_commands():
        assert argv[0] == "trinity-like" and argv[1] in ("compare", "run", "view", "report"), argv


def test_the_listing_dry_run_prints_what_the_doc_shows(tmp_path):
    (listing,) = doc_blocks("yaml")
    (tmp_path / "compare_hard.yaml").write_text(listing)
    (tmp_path / "examples").symlink_to(ROOT / "examples")  # the listing sits beside examples/
    argv = doc_commands()[1]
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "trinity_like.cli", *argv[1:], "--out", str(tmp_path / "out")],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    (shown,) = [b for b in doc_blocks("text") if b.startswith("plans:")]
    printed = done.stdout.splitlines()[: len(shown.splitlines())]
    for want, got in zip(shown.splitlines(), printed, strict=True):
        pattern = re.escape(want).replace(re.escape("{...}"), r"\{.+\}")  # the doc shortens a long mapping
        assert re.fullmatch(pattern, got), (want, got)
    assert "warning" not in done.stdout  # the same held-out set on both sides
    commands = [line for line in done.stdout.splitlines() if line.startswith(("grpo_hard/seed_", "mix_hard/seed_"))]
    assert len(commands) == 6 and all("--config" in c for c in commands)


def test_the_client_loops_compare_as_the_doc_says(tmp_path):
    argv = doc_commands()[2]
    scripts = [argv[i + 1] for i, a in enumerate(argv) if a == "--script"]
    assert [s.split("=", 1)[0] for s in scripts] == ["is", "kl"]
    args = list(argv[2:])
    for s in scripts:  # rl_env.py shrunk to the tiny model, run by this interpreter
        shrunk = s.replace("python examples/", f"{sys.executable} examples/").replace(" --seed", f" {TINY_LOOP} --seed")
        args[args.index(s)] = shrunk
    out = tmp_path / "out"
    done = compare(*args, "--seeds", "2", "--out", str(out), "--jobs", "2")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    rep = report(out)
    assert [r["status"] for r in rep["runs"]] == ["done"] * 4
    for r in rep["runs"]:
        lines = [json.loads(x) for x in (out / "runs" / r["label"] / f"seed_{r['seed']}" / "metrics.jsonl").open()]
        assert r["result"]["rows"] == sum(
            x["train/datums"] for x in lines if "train/datums" in x
        )  # 0: the tiny model never earns a reward
        assert r["result"]["tokens"] == sum(x["train/policy_tokens"] for x in lines if "train/policy_tokens" in x)
        assert r["result"]["accuracy"] == [x["eval/accuracy"] for x in lines if "eval/accuracy" in x][-1]
    shrunk = {s.split("=", 1)[0]: s.split("=", 1)[1] for s in args if s.startswith(("is=", "kl="))}
    assert rep["plan_diff"] == [{"key": "script", "values": shrunk}]  # scripts differ by their commands
    assert [b["metric"] for b in rep["comparisons"]["kl"]][0] == "held-out answer accuracy at the end"


def test_the_trackers_command_logs_to_all_three_sinks(tmp_path, monkeypatch):
    pytest.importorskip("wandb", reason="needs the trackers extra: pip install 'trinity-like[trackers]'")
    pytest.importorskip("mlflow", reason="needs the trackers extra: pip install 'trinity-like[trackers]'")
    for var in ("WANDB_MODE", "WANDB_DIR", "MLFLOW_TRACKING_URI"):
        monkeypatch.delenv(var, raising=False)
    argv = doc_commands()[3]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "RAY_AUTH_MODE": "disabled"}
    done = subprocess.run(
        [sys.executable, "-m", "trinity_like.cli", *argv[1:], *TINY_SETS, f"run_root={tmp_path}"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    run_dir = tmp_path / "grpo_add2"
    assert (run_dir / "metrics.jsonl").is_file()
    assert len(list(run_dir.glob("wandb/offline-run-*/run-*.wandb"))) == 1
    assert any((tmp_path / "mlruns").rglob("metrics/reward/mean"))  # the file store beside the run


def test_the_task_table_matches_the_sources():
    table = {r.split("|")[1].strip(" `"): r for r in doc_task_rows()}
    _, add2 = task_source("arithmetic_add2", {}, "x")
    source, mul1 = task_source("arithmetic_mul1", {}, "x")
    held_out = source(split="eval", size=None, seed=0, system_prompt=None, params=mul1)
    assert "8,100" in table["arithmetic_add2"] and 90 * 90 == 8100 and add2.ranges == ((10, 99), (10, 99))
    assert f"| {len(held_out)} (a third, by hash)" in table["arithmetic_mul1"]


def doc_task_rows() -> list[str]:
    text = (ROOT / "docs" / "compare.md").read_text()
    return [line for line in text.splitlines() if line.startswith("| `arithmetic_")]


def test_the_overhead_benchmark_runs_tiny(tmp_path):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "RAY_AUTH_MODE": "disabled"}
    done = subprocess.run(
        [sys.executable, "benchmarks/compare.py", "--tiny", "--results", str(tmp_path)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads((tmp_path / "compare_overhead_tiny.json").read_text())
    assert result["runs"] == 2 and len(result["by_hand_s"]) == len(result["runner_s"]) == 1
    assert result["overhead_median"] == pytest.approx(result["runner_s"][0] / result["by_hand_s"][0] - 1)
    assert len(result["commands"]) == 2 and all(" run --config " in c for c in result["commands"])
    md = (tmp_path / "compare_overhead_tiny.md").read_text()
    assert "The runner's own time" in md and "python benchmarks/compare.py --tiny" in md
    assert 0 < result["own_s"][0] < result["runner_s"][0]
