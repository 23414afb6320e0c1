"""The sampler-trainer gap (trainer/objective.py ``sampler_gap``) against a plain per-token loop.

Oracle: for every sampled, trained token, r = exp(logprob - rollout_logprob), k3 = r - 1 - log r
(Schulman 2020), written with ``math`` in Python floats, token by token.
"""

from __future__ import annotations

import json
import math

import pytest
import torch

from trinity_like.trainer.objective import sampler_gap


def oracle(logprob, rollout, mask, is_expert):
    k3, diffs = [], []
    for b in range(logprob.shape[0]):
        if is_expert is not None and bool(is_expert[b]):
            continue
        for j in range(logprob.shape[1]):
            if mask[b, j] > 0:
                d = float(logprob[b, j]) - float(rollout[b, j])
                k3.append(math.exp(d) - 1 - d)
                diffs.append(abs(d))
    return sum(k3) / len(k3), max(diffs), sum(diffs) / len(diffs)


@pytest.mark.parametrize("with_expert", [False, True])
def test_the_gap_is_the_per_token_loop(with_expert):
    g = torch.Generator().manual_seed(5)
    logprob = -torch.rand(6, 9, generator=g) * 4
    rollout = logprob + torch.randn(6, 9, generator=g) * 0.3
    mask = (torch.rand(6, 9, generator=g) > 0.3).float()
    is_expert = torch.tensor([False, True, False, False, True, False]) if with_expert else None
    if with_expert:
        rollout[1] = 0.0  # expert rows carry no sampler logprobs: a huge "gap" that must not count
        rollout[4] = 0.0
    got = sampler_gap(logprob.requires_grad_(), rollout, mask, is_expert)
    kl, most, mean = oracle(logprob.detach(), rollout, mask, is_expert)
    assert got["train/sampler_kl_k3"] == pytest.approx(kl, rel=1e-9)
    assert got["train/sampler_logprob_diff_max"] == pytest.approx(most, rel=1e-6)
    assert got["train/sampler_logprob_diff_mean"] == pytest.approx(mean, rel=1e-6)
    assert got["train/sampler_kl_k3"] > 0


def test_equal_logprobs_give_no_gap_and_no_sampled_tokens_give_no_metrics():
    logprob = -torch.rand(3, 4)
    mask = torch.ones(3, 4)
    got = sampler_gap(logprob, logprob.clone(), mask, torch.zeros(3, dtype=torch.bool))
    assert got == {
        "train/sampler_kl_k3": 0.0,
        "train/sampler_logprob_diff_max": 0.0,
        "train/sampler_logprob_diff_mean": 0.0,
    }
    assert sampler_gap(logprob, logprob, mask, torch.ones(3, dtype=torch.bool)) == {}  # expert rows only
    assert sampler_gap(logprob, logprob, torch.zeros(3, 4), None) == {}


# -- the recipe's bound on the gap (trainer.sampler_gap) --------------------------------------------------
def test_the_bound_line_names_step_metric_value_and_bound():
    from trinity_like.trainer.objective import gap_past_bound

    assert gap_past_bound({"train/sampler_kl_k3": 0.05}, 3, 0.1) is None
    assert gap_past_bound({"train/sampler_kl_k3": 0.5}, 3, None) is None  # no bound
    assert gap_past_bound({}, 3, 0.1) is None  # nothing sampled in the batch (expert rows only)
    line = gap_past_bound({"train/sampler_kl_k3": 0.25}, 7, 0.1)
    assert line.startswith("step 7: train/sampler_kl_k3 = 0.25 is above trainer.sampler_gap.max_kl_k3 = 0.1")
    assert "\n" not in line


RECIPE = """\
name: gap
model:
  path: tiny-random
  max_response_tokens: 4
algorithm:
  type: grpo
  dynamic_sampling: false
buffer:
  tasks:
    generator: arithmetic
explorer:
  batch_size: 2
  group_size: 4
trainer:
  engine: local
  total_steps: 2
monitor:
  progress: false
"""


def plan_of(tmp_path, *overrides):
    from trinity_like.config import load_plan

    path = tmp_path / "gap.yaml"
    path.write_text(RECIPE)
    return load_plan(path, [f"run_root={tmp_path}", *overrides])


def test_a_gap_past_the_bound_stops_the_run_with_one_line(tmp_path):
    """The tiny random model's bf16 sampler against its fp32 trainer has a k3 of a few 1e-2: far past 1e-6."""
    from trinity_like.errors import TrinityError
    from trinity_like.runner import run_plan

    plan = plan_of(tmp_path, "explorer.dtype=bfloat16", "model.dtype=float32", "trainer.sampler_gap.max_kl_k3=1e-6")
    with pytest.raises(TrinityError) as info:
        run_plan(plan)
    msg = str(info.value)
    assert msg.startswith("step 1: train/sampler_kl_k3 = ") and "above trainer.sampler_gap.max_kl_k3 = 1e-06" in msg
    assert "stopping before the step" in msg
    assert "\n" not in msg
    rows = [json.loads(line) for line in (tmp_path / "gap" / "metrics.jsonl").read_text().splitlines()]
    assert not any("actor/grad_norm" in r for r in rows)  # stopped before step 1's optimiser step


def test_warn_logs_every_step_past_the_bound_and_the_run_goes_on(tmp_path, capsys):
    """action: warn -- and a rollout correction on the same run: its masked fraction is logged each step."""
    from trinity_like.runner import run_plan

    plan = plan_of(
        tmp_path,
        "explorer.dtype=bfloat16",
        "model.dtype=float32",
        "trainer.sampler_gap.max_kl_k3=1e-6",
        "trainer.sampler_gap.action=warn",
        "algorithm.rollout_correction.name=icepop",
    )
    assert run_plan(plan) == 0
    out = capsys.readouterr().out
    for step in (1, 2):
        assert f"warning: step {step}: train/sampler_kl_k3 = " in out
    rows = [json.loads(line) for line in (tmp_path / "gap" / "metrics.jsonl").read_text().splitlines()]
    trained = [r for r in rows if "train/sampler_kl_k3" in r]
    assert [r["step"] for r in trained] == [1, 2]
    for r in trained:
        assert r["train/sampler_gap_warnings"] == 1.0 and r["train/sampler_kl_k3"] > 1e-6
        assert 0 <= r["rollout_corr/masked_token_frac"] <= 1


def test_the_bound_keys_are_checked(tmp_path):
    from trinity_like.errors import ConfigError

    with pytest.raises(ConfigError, match="trainer.sampler_gap.action"):
        plan_of(tmp_path, "trainer.sampler_gap.action=halt")
    with pytest.raises(ConfigError, match="trainer.sampler_gap.max_kl"):
        plan_of(tmp_path, "trainer.sampler_gap.max_kl=0.1")
    (stage,) = plan_of(tmp_path).stages
    assert stage.config.trainer.sampler_gap.max_kl_k3 == 0.1 and stage.config.trainer.sampler_gap.action == "stop"
