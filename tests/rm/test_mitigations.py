"""Reward-model mitigations: the ensemble, the composite reward and the per-batch transforms,
each against a hand computation (numpy) -- and the workflow applying a transform."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
import torch

from trinity_like.components import build_params
from trinity_like.errors import TrinityError
from trinity_like.explorer.engine import NativeEngine, SamplingParams
from trinity_like.explorer.rewards import build_reward_fn
from trinity_like.explorer.tasks import ArithmeticParams, arithmetic_tasks
from trinity_like.models.reward_model import (
    RewardModel,
    load_reward_model,
    save_reward_model,
    score_conversations,
)
from trinity_like.models.tiny import build_tiny_model
from trinity_like.registry import REWARD_TRANSFORM, WORKFLOW

MESSAGES = [{"role": "user", "content": "What is 2 + 3?"}]
RESPONSES = ["5", "6", "The answer is 5.", ""]


def test_ensemble_is_mean_minus_k_std_of_its_models(tmp_path):
    paths = []
    for seed in (1, 2, 3):
        backbone, tok = build_tiny_model(seed=seed)
        torch.manual_seed(seed)
        paths.append(str(save_reward_model(RewardModel(backbone), tok, tmp_path / f"rm{seed}")))
    fn = build_reward_fn("rm_ensemble", {"paths": paths, "k": 0.7})
    for response in RESPONSES:
        conv = [*MESSAGES, {"role": "assistant", "content": response}]
        each = np.array([score_conversations(*load_reward_model(p), [conv], 512)[0] for p in paths])
        want = each.mean() - 0.7 * each.std()  # numpy's std is the population std (ddof=0)
        assert fn({"messages": MESSAGES, "response": response}) == pytest.approx(want, abs=1e-5)
    assert len({round(fn({"messages": MESSAGES, "response": r}), 6) for r in RESPONSES}) > 1
    with pytest.raises(TrinityError, match="two or more"):
        build_reward_fn("rm_ensemble", {"paths": paths[:1]})


def test_composite_is_the_weighted_sum_of_its_terms():
    fn = build_reward_fn(
        "composite",
        {
            "terms": [
                {"name": "exact_match", "weight": 2.0},
                {"name": "format", "weight": 0.5, "args": {"reward": 1.0, "penalty": -1.0}},
            ]
        },
    )
    # (exact_match, format) by hand: "5" (1, 1), "6" (0, 1), "The answer is 5." (1, -1), "" (0, -1)
    for response, (em, fmt) in zip(RESPONSES, [(1, 1), (0, 1), (1, -1), (0, -1)]):
        assert fn({"response": response, "answer": "5", "messages": MESSAGES}) == pytest.approx(2.0 * em + 0.5 * fmt)
    with pytest.raises(TrinityError, match="composite.terms.1: unknown reward function 'nope'"):
        build_reward_fn("composite", {"terms": [{"name": "format"}, {"name": "nope"}]})
    with pytest.raises(TrinityError, match="composite.terms.0.args.patern: unknown parameter"):
        build_reward_fn("composite", {"terms": [{"name": "format", "args": {"patern": "x"}}]})
    with pytest.raises(TrinityError, match="terms is empty"):
        build_reward_fn("composite", {"terms": []})


def transform(name, rewards, **values):
    fn = REWARD_TRANSFORM.get(name)
    return fn(rewards=rewards, params=build_params(fn, values))


def test_batch_clip_and_normalize_against_numpy():
    r = np.array([0.1, 0.2, 0.15, 5.0, -3.0, 0.12, 0.3, 0.18])
    lo, hi = r.mean() - 1.5 * r.std(), r.mean() + 1.5 * r.std()
    assert transform("batch_clip", list(r), std_clip=1.5) == pytest.approx(np.clip(r, lo, hi).tolist())
    assert transform("batch_clip", list(r), std_clip=None, low=0.0, high=1.0) == pytest.approx(
        np.clip(r, 0, 1).tolist()
    )
    assert transform("batch_clip", list(r), std_clip=1.5, high=0.2) == pytest.approx(np.clip(r, lo, 0.2).tolist())
    z = (r - r.mean()) / (r.std() + 1e-6)
    assert transform("batch_normalize", list(r)) == pytest.approx(z.tolist())
    assert transform("batch_normalize", list(r), clip=1.0) == pytest.approx(np.clip(z, -1, 1).tolist())
    assert transform("batch_normalize", [2.0, 2.0]) == [0.0, 0.0]  # a constant batch: no division by zero


def test_the_workflow_applies_a_transform_to_the_whole_batch_and_keeps_the_raw_reward():
    model, tok = build_tiny_model(seed=0)
    engine = NativeEngine(model, tok)
    cls = WORKFLOW.get("math")
    params = build_params(
        cls,
        {
            "reward_fn": "format",
            "reward_params": {"pattern": ".*[0-9].*"},
            "reward_transform": "batch_normalize",
            "reward_transform_args": {"eps": 0.0},
        },
    )
    tasks = arithmetic_tasks(ArithmeticParams(), "train", 4)
    result = cls(params=params).run(tasks, engine=engine, sampling=SamplingParams(n=4, max_new_tokens=8, seed=5))
    raw = np.array([e.info["raw_reward"] for e in result.experiences])
    assert 0 < raw.mean() < 1  # some have a digit, some not
    got = np.array([e.reward for e in result.experiences])
    assert got == pytest.approx((raw - raw.mean()) / raw.std())  # over the batch, not per group
    assert result.metrics["reward/raw_mean"] == pytest.approx(raw.mean())
    assert result.metrics["reward/mean"] == pytest.approx(0.0, abs=1e-9)
    with pytest.raises(TrinityError, match="reward_transform_args.std_clp"):
        cls(params=build_params(cls, {"reward_transform": "batch_clip", "reward_transform_args": {"std_clp": 1}}))


@pytest.mark.parametrize(
    "override, message",
    [
        ("explorer.reward_args={terms: [{name: nope}]}", "composite.terms.0: unknown reward function 'nope'"),
        ("explorer.reward_args={terms: [{name: composite}]}", "composite.terms.0: a composite inside a composite"),
        (
            "explorer.workflow_args={reward_transform: batch_clp}",
            "unknown reward transform 'batch_clp'; did you mean 'batch_clip'",
        ),
        (
            "explorer.workflow_args={reward_transform: batch_clip, reward_transform_args: {std_clp: 1}}",
            "reward_transform_args.std_clp: unknown parameter of batch_clip",
        ),
    ],
)
def test_a_recipes_mistake_in_a_mitigation_fails_at_validation(override, message):
    from trinity_like.config import load_plan

    recipe = Path(__file__).resolve().parents[2] / "examples" / "grpo_with_rm.yaml"
    extra = ["explorer.reward_fn=composite"] if "terms" in override else []
    with pytest.raises(TrinityError, match=re.escape(message)) as info:
        load_plan(recipe, [*extra, override])
    assert "grpo_with_rm.yaml" in str(info.value)
