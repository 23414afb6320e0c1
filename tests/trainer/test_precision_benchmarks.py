"""The precision benchmarks' commands as docs/precision.md shows them, in their ``--tiny`` modes, run
and report both precisions (benchmarks/precision.py, grpo_step.py, rollout.py). ``TRINITY_LIKE_CPU_BF16=on`` gives them the bf16 CPU path on any CPU
(emulated, slow, but the same code); ``off`` makes ``grpo_step.py --precision bf16`` refuse in one line."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOC = (ROOT / "docs" / "precision.md").read_text()
COMMANDS = {  # script -> the doc's flags
    Path(argv[1]).name: argv[2:]
    for argv in map(shlex.split, re.findall(r"^```bash\n(.*?)^```", DOC, flags=re.S | re.M)[-1].splitlines())
}


def bench(script: str, *argv: str, bf16: str = "on") -> subprocess.CompletedProcess:
    """The doc's command for ``script`` plus ``argv`` (``--tiny`` and what it must not write over)."""
    env = {**os.environ, "TRINITY_LIKE_CPU_BF16": bf16, "HF_HUB_OFFLINE": "1", "RAY_AUTH_MODE": "disabled"}
    return subprocess.run(
        [sys.executable, f"benchmarks/{script}", *COMMANDS[script], *argv],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )


def test_the_doc_shows_the_three_benchmarks_in_both_precisions():
    assert set(COMMANDS) == {"precision.py", "grpo_step.py", "rollout.py"}
    assert COMMANDS["grpo_step.py"][-2:] == COMMANDS["rollout.py"][-2:] == ["--precision", "both"]


def test_the_profile_reports_both_precisions_split_by_op_group(tmp_path):
    out = bench("precision.py", "--tiny", "--out", str(tmp_path / "p"))  # the doc's --reps 5: 2 with --tiny
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads((tmp_path / "p.json").read_text())
    assert set(result["update_s"]) == set(result["rollout_tok_s"]) == {"fp32", "bf16"}
    for name in ("fp32", "bf16"):
        groups = result["profile_s"][name]
        assert {"matmul", "attention", "optimiser", "element-wise"} <= set(groups)
        assert all(v >= 0 for v in groups.values()) and groups["matmul"] > 0
    assert result["meta"]["peaks_gflops"]["bf16"] > 0 and result["meta"]["peaks_gflops"]["fp32"] > 0
    text = (tmp_path / "p.md").read_text()
    assert "| fp32 |" in text and "| bf16 |" in text and "CPUs" in text
    gap = {k: v["train/sampler_kl_k3"] for k, v in result["gap"].items()}
    assert gap["fp32 sampler, fp32 trainer"] < 1e-6  # the same numerics on both sides: no gap
    assert min(gap["bf16 sampler, bf16 trainer"], gap["bf16 sampler, fp32 trainer"]) > 100 * max(
        gap["fp32 sampler, fp32 trainer"], 1e-9
    )


def test_the_grpo_step_runs_ours_in_each_precision_and_says_which(tmp_path):
    out = bench("grpo_step.py", "--tiny", "--contenders", "local", "--out", str(tmp_path / "gs"))
    assert out.returncode == 0, out.stderr[-3000:]
    fp32, bf16 = ((tmp_path / f"gs_{p}.md").read_text() for p in ("fp32", "bf16"))
    assert "fp32 on both sides" in fp32 and "bf16 compute over fp32 weights on both sides" in bf16
    logs = out.stdout + out.stderr
    assert "train fp32 (model.dtype = float32), rollout fp32" in logs
    assert "train bf16 compute over fp32 master weights (model.dtype auto), rollout bf16" in logs
    for p in ("fp32", "bf16"):
        ours = json.loads((tmp_path / f"gs_{p}.json").read_text())["rounds"][0]["local"]
        assert ("model.dtype=float32" in ours["overrides"]) == (p == "fp32")
        for step in ours["steps"]:  # read from the step's own metrics, no engine patched
            assert step["rows_trained"] > 0 and step["real_tokens"] > step["run_tokens"] > 0
            assert 0 < step["time/update.forward_backward"] < step["train_s"]


def test_the_grpo_step_refuses_bf16_where_auto_trains_fp32(tmp_path):
    out = bench(
        "grpo_step.py",
        "--tiny",
        "--contenders",
        "local",
        "--precision",
        "bf16",
        "--out",
        str(tmp_path / "x"),
        bf16="off",
    )
    assert out.returncode != 0
    assert "--precision bf16: model.dtype auto trains fp32 on this CPU" in out.stderr


def test_the_rollout_benchmark_times_both_precisions(tmp_path):
    out = bench("rollout.py", "--tiny", "--out", str(tmp_path / "r"))
    assert out.returncode == 0, out.stderr[-3000:]
    (result,) = json.loads((tmp_path / "r.json").read_text())["results"]
    names = set(result["summary"])
    assert {"ours", "generate", "ours-bf16", "generate-bf16", "generate+logprobs-bf16"} <= names
    assert result["summary"]["ours-bf16"]["ratio_vs_generate-bf16"] > 0
    assert "ours-bf16 / ours (fp32)" in (tmp_path / "r.md").read_text()
