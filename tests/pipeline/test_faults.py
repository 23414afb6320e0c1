"""Bad input and faults of a run: missing model, unreachable Ray, NaN losses."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from safetensors.torch import load_file

from trinity_like.config import load_plan
from trinity_like.errors import TrinityError
from trinity_like.runner import run_plan

REPO = Path(__file__).resolve().parents[2]
RECIPE = REPO / "examples" / "grpo_arith.yaml"
TINY = [
    "model.path=tiny-random",
    "trainer.engine=local",
    "buffer.eval_tasks.size=4",
    "explorer.batch_size=2",
    "explorer.group_size=4",
    "monitor.progress=false",
    "monitor.eval_at_start=false",
]


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "trinity_like.cli", *args],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "RAY_AUTH_MODE": "disabled"},
    )


def test_missing_model_is_one_line_naming_what_was_tried(tmp_path):
    out = cli("validate", str(RECIPE), f"model.path={tmp_path / 'no_model'}")
    assert out.returncode == 2
    assert out.stderr.count("\n") == 1
    assert "model.path: model" in out.stderr and "not found" in out.stderr and "smollm2-135m-instruct" in out.stderr


NAN_PLUGIN = textwrap.dedent(
    '''
    import torch
    from trinity_like.components import AlgorithmType
    from trinity_like.registry import ALGORITHM_TYPE, POLICY_LOSS_FN

    CALLS = {"n": 0}

    @POLICY_LOSS_FN.register_module("nan_after")
    def nan_after(*, logprob, action_mask):
        """Finite on the first call, NaN afterwards."""
        CALLS["n"] += 1
        loss = -(logprob * action_mask).sum() / action_mask.sum()
        return (loss if CALLS["n"] == 1 else loss * float("nan")), {}

    ALGORITHM_TYPE.register_module("nan_algo", module=AlgorithmType(
        description="Test: NaN losses.", policy_loss="nan_after", advantage="grpo"))
    '''
)


def test_nan_losses_are_skipped_then_stop_the_run_with_weights_untouched(tmp_path):
    plugin = tmp_path / "nan_plugin.py"
    plugin.write_text(NAN_PLUGIN)
    plan = load_plan(
        RECIPE,
        [
            f"run_root={tmp_path}",
            *TINY,
            "algorithm.type=nan_algo",
            "algorithm.kl_loss={}",
            "algorithm.dynamic_sampling=false",
            "trainer.total_steps=10",
            "trainer.max_nan_steps=2",
            "checkpoint.interval=1",
            "checkpoint.keep_last=10",
        ],
        plugins=[str(plugin)],
    )
    with pytest.raises(TrinityError, match="3 non-finite losses in a row"):
        run_plan(plan)
    run_dir = tmp_path / "grpo_arith"
    ckpts = sorted((run_dir / "checkpoints").glob("step_*"))
    # Steps 1 (finite), 2 and 3 (NaN, skipped) were checkpointed; step 4 stopped the run.
    assert [p.name for p in ckpts][-2:] == ["step_000002", "step_000003"]
    after_good = load_file(str(run_dir / "checkpoints" / "step_000001" / "model" / "model.safetensors"))
    after_nans = load_file(str(ckpts[-1] / "model" / "model.safetensors"))
    assert after_good.keys() == after_nans.keys()
    assert all((after_good[k] == after_nans[k]).all() for k in after_good)
    rows = (run_dir / "metrics.jsonl").read_text()
    assert rows.count('"skipped/nan_loss": 1.0') == 2


@pytest.mark.slow
def test_unreachable_ray_address_is_one_clear_line(tmp_path):
    out = cli(
        "run",
        "--config",
        str(RECIPE),
        f"run_root={tmp_path}",
        "model.path=tiny-random",
        "cluster.ray_address=127.0.0.1:9",
        "monitor.progress=false",
        "monitor.eval_at_start=false",
    )
    assert out.returncode == 2, out.stderr[-2000:]
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith("trinity-like: error:") and "127.0.0.1:9" in last
    assert "Traceback" not in out.stderr
