"""docs/gpu.md as written: its snippets run, its recipe block validates, its commands are the ones
the CI test and scripts/gpu_wheels.sh run and print, and its precision table is what the code decides."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from _lib.scripts import load_script

from trinity_like.config.schema import Config
from trinity_like.models.device import precision

ROOT = Path(__file__).resolve().parents[2]
DOC = (ROOT / "docs" / "gpu.md").read_text()


def blocks(lang: str) -> list[str]:
    return re.findall(rf"^```{lang}\n(.*?)^```", DOC, flags=re.S | re.M)


@pytest.mark.parametrize("index", range(len(blocks("python"))))
def test_python_snippets_run_as_written(index):
    code = blocks("python")[index]
    result = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    if "hf_generate" in code:
        assert result.stdout.strip().splitlines()[-1] == "True"  # two engines, one seed: the same samples


def test_the_recipe_block_is_a_valid_recipe_with_the_documented_default():
    (block,) = blocks("yaml")
    config = Config.model_validate(yaml.safe_load(block))
    assert config.cluster.device == Config().cluster.device == "auto"


def test_the_cpu_command_is_the_one_ci_runs():
    (block,) = blocks("bash")
    argv = shlex.split(block.strip())
    assert argv[:2] == ["python", "benchmarks/gpu_check.py"] and argv[2:5] == ["--device", "cpu", "--tiny"]
    ci = (ROOT / "tests" / "examples" / "test_gpu_check_benchmark.py").read_text()
    assert '"--device", "cpu", "--tiny"' in ci


def test_the_device_command_is_the_one_the_wheel_script_prints_and_loses_nothing():
    (block,) = blocks("text")
    script = (ROOT / "scripts" / "gpu_wheels.sh").read_text()
    assert block.strip() in script and 'sed "s/<sha>/${sha}/"' in script  # printed with the commit filled in
    assert "benchmarks/gpu_check.py" in block and ".whl/*.whl" in block
    # A failing check fails the call (not tee's 0), output is not held in a buffer when the job is
    # cut off, the commit is named (no repository there), and everything lands in what comes back.
    assert block.startswith("set -o pipefail;") and "PYTHONUNBUFFERED=1" in block
    argv = shlex.split(block.split("python3 benchmarks/gpu_check.py", 1)[1].split("2>&1")[0])
    assert argv == ["--commit", "<sha>", "--out", "$OUT/gpu_check"]
    assert block.strip().endswith("| tee $OUT/gpu_check.log")
    gpu_check = load_script("benchmarks/gpu_check.py")

    args = gpu_check.build_parser().parse_args(argv)  # the check takes them as written
    assert (args.commit, str(args.out), args.device) == ("<sha>", "$OUT/gpu_check", "auto")


def test_the_documented_plan_is_the_checks():
    gpu_check = load_script("benchmarks/gpu_check.py")

    rows = re.findall(r"^\| `(\w+)` \| (\d+) \| ", DOC, flags=re.M)
    assert {name: float(seconds) for name, seconds in rows} == gpu_check.PLAN_S
    assert sum(gpu_check.PLAN_S.values()) < gpu_check.BUDGET_S == 360  # "at most 6 minutes"
    assert f"{gpu_check.BUDGET_S:.0f} s" in DOC and "not measured" in DOC


def test_the_precision_table_is_what_precision_decides():
    cpu, cuda = precision(torch.device("cpu")), precision(torch.device("cuda", 0))
    row = re.search(r"^\| rollout weights and KV cache \| (\w+) \| (\w+) \|$", DOC, flags=re.M)
    assert row and (row[1], row[2]) == ("fp32", "bf16")
    assert (cpu.rollout, cuda.rollout) == (torch.float32, torch.bfloat16)
    assert (cpu.train_weights, cuda.train_weights) == (torch.float32, torch.float32)
    assert (cpu.train_compute, cuda.train_compute) == (None, torch.bfloat16)
    assert "| rollout at defaults >= 2x plain `generate`, both shapes |" in DOC  # the targets stay listed


def test_the_plugin_guide_command_lists_both_engines():
    guide = (ROOT / "plugins" / "README.md").read_text()
    (command,) = re.findall(r"`(trinity-like list rollout_engine [^`]+)`", guide)
    argv = shlex.split(command)[1:]
    result = subprocess.run(
        [sys.executable, "-m", "trinity_like.cli", *argv], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "hf_generate" in result.stdout and "native" in result.stdout
