"""docs/precision.md as written: its table is what ``precision()`` decides on each kind of device, its
commands run and print the lines it shows, its recipe block resolves, its figures are the saved
benchmark's (benchmarks/results/precision.json). The benchmark commands run in
tests/trainer/test_precision_benchmarks.py."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from trinity_like.config import load_plan
from trinity_like.models import device as dev

ROOT = Path(__file__).resolve().parents[2]
DOC = (ROOT / "docs" / "precision.md").read_text()
NAMES = {torch.bfloat16: "bf16", torch.float32: "fp32"}


def blocks(lang: str) -> list[str]:
    return re.findall(rf"^```{lang}\n(.*?)^```", DOC, flags=re.S | re.M)


def cli(argv: list[str], bf16: str) -> subprocess.CompletedProcess:
    assert argv[0] == "trinity-like"
    env = {**os.environ, "TRINITY_LIKE_CPU_BF16": bf16, "HF_HUB_OFFLINE": "1", "RAY_AUTH_MODE": "disabled"}
    return subprocess.run(
        [sys.executable, "-m", "trinity_like.cli", *argv[1:]],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )


def test_the_table_is_what_precision_decides_on_each_device(monkeypatch):
    rows = {
        m[1]: m.groups()[1:] for m in re.finditer(r"^\| ([a-zA-Z ,]+) \| (\w+) \| (\w+) \| (\w+) \|$", DOC, flags=re.M)
    }
    cuda = dev.precision(torch.device("cuda", 0))
    monkeypatch.setattr(dev, "cpu_bf16_flags", lambda: frozenset({"avx512_bf16"}))
    with_units = dev.precision(torch.device("cpu"))
    monkeypatch.setattr(dev, "cpu_bf16_flags", lambda: frozenset())
    without = dev.precision(torch.device("cpu"))
    columns = (cuda, with_units, without)
    assert rows["rollout weights and KV cache"] == tuple(NAMES[p.rollout] for p in columns)
    assert rows["train forward and backward"] == tuple(NAMES[p.train_compute or p.train_weights] for p in columns)
    assert rows["train master weights, AdamW moments"] == tuple(NAMES[p.train_weights] for p in columns)


def test_the_dry_run_prints_the_lines_shown_with_and_without_bf16_units():
    dry_run, fp32_run, _ = (shlex.split(b) for b in blocks("bash"))
    with_units, without = (b.rstrip("\n") for b in blocks("text"))
    out = cli(dry_run, "off")
    assert out.returncode == 0, out.stderr[-2000:]
    assert without in out.stdout.splitlines()
    # `on` stands in for the flag on any machine; only the reason's wording differs
    out = cli(dry_run, "on")
    assert out.returncode == 0, out.stderr[-2000:]
    assert with_units.replace("CPU has avx512_bf16", "CPU has TRINITY_LIKE_CPU_BF16=on") in out.stdout.splitlines()
    pinned = cli([*fp32_run, "--dry-run"], "on")
    assert pinned.returncode == 0, pinned.stderr[-2000:]
    want = "  precision on cpu: train fp32 (model.dtype = float32), rollout fp32 weights and KV cache (explorer.dtype = float32)"
    assert want in pinned.stdout.splitlines()


def test_the_fp32_command_and_the_default_both_train(tmp_path):
    """The doc's fp32 command and the default, shrunk to the tiny model on the local engine: both
    finish, and each step logs the gap -- ~0 in fp32 on both sides, larger with the bf16 path."""
    _, fp32_run, _ = (shlex.split(b) for b in blocks("bash"))
    tiny = [
        f"run_root={tmp_path}",
        "model.path=tiny-random",
        "trainer.engine=local",
        "trainer.total_steps=2",
        "explorer.batch_size=2",
        "explorer.group_size=4",
        "buffer.eval_tasks.size=4",
        "monitor.progress=false",
        "algorithm.dynamic_sampling=false",
    ]
    gaps = {}
    for name, argv in (("fp32", fp32_run), ("default", fp32_run[:4])):
        out = cli([*argv, *tiny, f"name={name}"], "on")
        assert out.returncode == 0, out.stderr[-3000:]
        rows = [json.loads(line) for line in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]
        gaps[name] = [r["train/sampler_kl_k3"] for r in rows if "train/sampler_kl_k3" in r]
        assert len(gaps[name]) == 2  # every step
    assert max(gaps["fp32"]) < 1e-6
    assert min(gaps["default"]) > 1e-4


def test_the_recipe_block_turns_on_a_rollout_correction():
    (block,) = blocks("yaml")

    def flat(d, prefix=""):
        for k, v in d.items():
            yield from flat(v, f"{prefix}{k}.") if isinstance(v, dict) else [f"{prefix}{k}={v}"]

    plan = load_plan(ROOT / "examples" / "grpo_arith.yaml", list(flat(yaml.safe_load(block))))
    corr = plan.stages[0].components["rollout_correction"]
    assert corr.name == "token_tis" and corr.params.cap == 2.0


def test_the_corrections_table_is_the_registry_with_its_defaults():
    """Every ROLLOUT_CORRECTION entry has a row, and the defaults the row gives are its params object's."""
    import dataclasses

    from trinity_like.components import params_type
    from trinity_like.registry import ROLLOUT_CORRECTION

    rows = {r[0].strip("` "): r for r in (line.split("|")[1:-1] for line in DOC.splitlines()) if len(r) == 5}
    listed = {name for name in rows if name in ROLLOUT_CORRECTION}
    assert listed == set(ROLLOUT_CORRECTION.names())
    for name in listed:
        for f in dataclasses.fields(params_type(ROLLOUT_CORRECTION.get(name))):
            assert f"= {f.default}" in rows[name][3] and f"`{f.name}`" in rows[name][3], (name, f.name)


@pytest.fixture(scope="module")
def saved() -> dict:
    return json.loads((ROOT / "benchmarks" / "results" / "precision.json").read_text())


def test_the_figures_are_the_saved_benchmarks(saved):
    m, peaks = saved["meta"], saved["meta"]["peaks_gflops"]
    for name in ("fp32", "bf16"):
        cpu = saved["update_s"][name]["cpu"]
        rate = m["gflop"] / cpu / m["threads"]
        row = f"| {name} | {cpu:.2f} | {rate:.0f} | {rate / peaks[name]:.0%} | {saved['rollout_tok_s'][name]['cpu']:.0f} |"
        assert row in DOC, row
    for combo, gap in saved["gap"].items():
        assert f"| {combo} | {gap['train/sampler_kl_k3']:.2e} | {gap['train/sampler_logprob_diff_max']:.3f} |" in DOC
    update = saved["update_s"]["fp32"]["cpu"] / saved["update_s"]["bf16"]["cpu"]
    rollout = saved["rollout_tok_s"]["bf16"]["cpu"] / saved["rollout_tok_s"]["fp32"]["cpu"]
    assert f"the update {update:.1f}x, the rollout {rollout:.1f}x" in DOC
    assert "AMD EPYC" in m["cpu"] and "avx512_bf16" in m["cpu"]  # the CPU the doc names


def test_a_bad_setting_of_the_variable_is_one_line_naming_it():
    dry_run = shlex.split(blocks("bash")[0])
    out = cli(dry_run, "yes")
    assert out.returncode == 2
    assert out.stderr.strip().splitlines() == [
        "trinity-like: error: environment variable TRINITY_LIKE_CPU_BF16='yes': expected auto, on or off"
    ]
