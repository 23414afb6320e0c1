"""The math workflow end to end on the tiny model, including failing reward functions."""

from __future__ import annotations

import time
from dataclasses import dataclass

import pytest

from trinity_like.components import build_params
from trinity_like.experience import Task
from trinity_like.explorer.engine import NativeEngine, SamplingParams
from trinity_like.explorer.tasks import ArithmeticParams, arithmetic_tasks
from trinity_like.models.chat import render_prompt
from trinity_like.models.tiny import build_tiny_model
from trinity_like.registry import REWARD_FN, WORKFLOW


@dataclass(frozen=True)
class FailParams:
    bad_answer: str = ""  # tasks with this answer fail


@REWARD_FN.register_module("test_raises_on_answer", force=True)
def raises_on_answer(*, response: str, answer: str, params: FailParams) -> float:
    """Raises for one answer, else 1.0 (test only)."""
    if answer == params.bad_answer:
        raise ValueError(f"cannot score answer {answer}")
    return 1.0


@REWARD_FN.register_module("test_hangs_on_answer", force=True)
def hangs_on_answer(*, answer: str, params: FailParams) -> float:
    """Sleeps past any time limit for one answer, else 0.5 (test only)."""
    if answer == params.bad_answer:
        time.sleep(30)
    return 0.5


@pytest.fixture(scope="module")
def engine():
    model, tok = build_tiny_model(seed=0)
    return NativeEngine(model, tok)


def make(name, **params):
    cls = WORKFLOW.get("math")
    return cls(params=build_params(cls, {"reward_fn": name, **params}))


def test_math_workflow_builds_scored_groups(engine):
    tasks = arithmetic_tasks(ArithmeticParams(), "train", 3)
    # One task whose answer the tiny random model will not produce, one that any text
    # containing the number matches: the reward is checked against exact_match by hand.
    result = make("exact_match").run(tasks, engine=engine, sampling=SamplingParams(n=4, max_new_tokens=8, seed=3))
    assert len(result.experiences) == 12 and not result.skipped
    tok = engine.tokenizer
    for i, task in enumerate(tasks):
        group = result.experiences[4 * i : 4 * i + 4]
        assert len({e.group_id for e in group}) == 1
        prompt = render_prompt(tok, task.messages())
        for e in group:
            assert e.task_id == task.task_id and e.prompt_length == len(prompt)
            assert e.tokens[: e.prompt_length] == prompt
            assert len(e.logprobs) == e.response_length <= 8
            assert e.finish_reason in ("stop", "length") and e.model_version == 0
            text = tok.decode(e.response_tokens, skip_special_tokens=True)
            digits = "".join(c if c.isdigit() or c == "-" else " " for c in text).split()
            assert e.reward == (1.0 if digits and digits[-1] == task.answer else 0.0)
    assert len({e.group_id for e in result.experiences}) == 3
    assert result.metrics["workflow/skipped_tasks"] == 0
    assert result.metrics["reward/mean"] == sum(e.reward for e in result.experiences) / 12


def test_raising_reward_skips_the_task_and_counts_it(engine):
    tasks = [Task("What is 1 + 1?", "2", "t-ok"), Task("What is 2 + 2?", "4", "t-bad"), Task("3 + 3", "6", "t-ok2")]
    wf = make("test_raises_on_answer", reward_params={"bad_answer": "4"}, reward_retries=2)
    result = wf.run(tasks, engine=engine, sampling=SamplingParams(n=2, max_new_tokens=4))
    assert [s.task_id for s in result.skipped] == ["t-bad"]
    assert "ValueError: cannot score answer 4" in result.skipped[0].reason
    assert {e.task_id for e in result.experiences} == {"t-ok", "t-ok2"}
    assert len(result.experiences) == 4
    assert result.metrics["workflow/reward_errors"] == 1
    assert result.metrics["workflow/reward_retries"] == 2
    assert result.metrics["workflow/skipped_tasks"] == 1


def test_timing_out_reward_is_retried_then_skipped(engine):
    tasks = [Task("What is 5 + 5?", "10", "t-slow"), Task("What is 1 + 2?", "3", "t-fast")]
    # A time limit generous enough for the fast calls on a loaded machine.
    wf = make("test_hangs_on_answer", reward_params={"bad_answer": "10"}, reward_timeout_s=1.0, reward_retries=1)
    t0 = time.perf_counter()
    result = wf.run(tasks, engine=engine, sampling=SamplingParams(n=2, max_new_tokens=4))
    assert time.perf_counter() - t0 < 20  # it did not wait for the 30 s sleeps
    assert [(s.task_id, s.reason) for s in result.skipped] == [("t-slow", "reward_fn test_hangs_on_answer: timeout")]
    assert [e.reward for e in result.experiences] == [0.5, 0.5]
    assert result.metrics["workflow/reward_timeouts"] == 1


def test_unknown_reward_fn_is_an_error():
    with pytest.raises(KeyError, match="exact_match"):
        make("exact_mach")
