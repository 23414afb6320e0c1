"""The arithmetic env gives what the math workflow gives, for the same tasks, seed and sampling."""

from __future__ import annotations

import pytest

from trinity_like.components import build_params
from trinity_like.envs.dataset import TaskEnvDataset, build_env_factory
from trinity_like.envs.experience import group_experiences
from trinity_like.envs.rollout import RolloutParams, rollout_groups
from trinity_like.explorer.engine import SamplingParams
from trinity_like.explorer.tasks import ArithmeticParams, arithmetic_tasks
from trinity_like.registry import REWARD_FN, WORKFLOW


@REWARD_FN.register_module("test_response_chars", force=True)
def response_chars(*, response: str) -> float:
    """The response's length in characters (test only: a reward that varies on a random model)."""
    return float(len(response))


@pytest.mark.parametrize("reward_fn", ["exact_match", "test_response_chars"])
def test_arithmetic_env_equals_the_math_workflow(engine, tok, reward_fn):
    tasks = arithmetic_tasks(ArithmeticParams(), "train", 3)
    workflow = WORKFLOW.get("math")
    old = workflow(params=build_params(workflow, {"reward_fn": reward_fn})).run(
        tasks, engine=engine, sampling=SamplingParams(n=4, max_new_tokens=8, temperature=0.9, top_p=0.95, seed=11)
    )
    factory = build_env_factory("arithmetic", {"reward_fn": reward_fn, "max_tokens": 8}, tokenizer=tok)
    builders = TaskEnvDataset(tasks, factory, batch_size=3, group_size=4).get_batch(0)
    result = rollout_groups(builders, engine=engine, seed=11, params=RolloutParams(temperature=0.9, top_p=0.95))
    new = group_experiences(result)
    assert len(new) == len(old.experiences) == 12 and not result.dropped
    for a, b in zip(old.experiences, new):
        assert a.tokens == b.tokens and a.prompt_length == b.prompt_length
        # Same tokens; logprobs to float precision (the engine may reuse the first call's cached prompt).
        assert b.logprobs == pytest.approx(a.logprobs, abs=1e-5) and a.mask() == b.mask()
        assert a.reward == b.reward and a.finish_reason == b.finish_reason
    # The groups are the workflow's groups (4 samples of one task share a group id).
    assert [len({e.group_id for e in new[i : i + 4]}) for i in range(0, 12, 4)] == [1, 1, 1]
    assert len({e.group_id for e in new}) == 3
    assert result.metrics["reward/mean"] == pytest.approx(old.metrics["reward/mean"])
    if reward_fn == "test_response_chars":
        assert len({e.reward for e in new}) > 1  # the comparison is not between constants


def test_a_failing_reward_drops_the_group_like_the_workflow_skips_it(engine, tok):
    factory = build_env_factory(
        "arithmetic", {"reward_fn": "format", "reward_params": {"pattern": "("}}, tokenizer=tok
    )  # an invalid regex: the reward fn raises on every call
    tasks = arithmetic_tasks(ArithmeticParams(), "train", 2)
    result = rollout_groups(
        TaskEnvDataset(tasks, factory, batch_size=2, group_size=2).get_batch(0), engine=engine, seed=0
    )
    assert not result.groups and len(result.dropped) == 2
    reason = result.dropped[0].reason
    assert reason.startswith("AnswerEnv (group 0, env 0) step at turn 0: ") and "missing )" in reason
    assert result.metrics["rollout/env_errors"] == 4  # one retry per group
