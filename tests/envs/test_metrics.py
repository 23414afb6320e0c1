"""Env metrics: a declared name is logged in every rollout that kept an episode (0 when no episode
reported it), an undeclared one only where reported, a name the env did not declare is a contract
error; the same rule for logging tags and for the recipe's `env` workflow."""

from __future__ import annotations

import statistics

import pytest

from trinity_like.envs.rollout import rollout_groups
from trinity_like.envs.types import Env, EnvGroupBuilder, StepResult, StopCondition
from trinity_like.envs.workflow import EnvWorkflow, EnvWorkflowParams
from trinity_like.errors import TrinityError
from trinity_like.experience import Task
from trinity_like.explorer.engine import SamplingParams
from trinity_like.models.chat import render_prompt


class Counting(Env):
    """One turn; reports ``report`` (a dict of step metrics) and scores the action's first token's parity."""

    def __init__(self, tok, report):
        self.prompt, self.report = render_prompt(tok, [{"role": "user", "content": "Go."}]), report

    def initial_observation(self):
        return list(self.prompt), StopCondition(max_tokens=2)

    def step(self, action):
        return StepResult(float(action[0] % 2), True, metrics=dict(self.report))


class Declared(Counting):
    metric_names = ("correct", "tool_calls", "tool_errors")


class Group(EnvGroupBuilder):
    def __init__(self, make, reports, tags=()):
        self.make, self.reports, self.tags = make, reports, list(tags)

    def make_envs(self):
        return [self.make(r) for r in self.reports]

    def logging_tags(self):
        return self.tags


def test_declared_names_are_logged_as_zero_when_no_episode_reports_them(engine, tok):
    reports = [{"correct": 1.0, "tool_calls": 2.0}, {"correct": 0.0}, {"correct": 1.0, "tool_calls": 1.0}]
    builders = [Group(lambda r: Declared(tok, r), reports[:2], ["a"]), Group(lambda r: Declared(tok, r), reports[2:])]
    metrics = rollout_groups(builders, engine=engine, seed=0).metrics
    # by hand: summed over each episode, averaged over the 3 episodes, 0 where an episode did not report
    assert metrics["env/correct"] == pytest.approx(2 / 3)
    assert metrics["env/tool_calls"] == pytest.approx(statistics.fmean([2.0, 0.0, 1.0]))
    assert metrics["env/tool_errors"] == 0.0  # declared, reported by no episode: 0, not absent
    assert metrics["tag/a/env/tool_calls"] == pytest.approx(1.0) and metrics["tag/a/env/tool_errors"] == 0.0


def test_undeclared_names_are_logged_only_where_some_episode_reported_them(engine, tok):
    builders = [Group(lambda r: Counting(tok, r), [{"correct": 1.0}, {}])]
    metrics = rollout_groups(builders, engine=engine, seed=0).metrics
    assert metrics["env/correct"] == 0.5
    assert not [k for k in metrics if k.startswith("env/") and k != "env/correct"]


def test_a_name_the_env_did_not_declare_stops_the_rollout(engine, tok):
    builders = [Group(lambda r: Declared(tok, r), [{"corect": 1.0}])]
    with pytest.raises(TrinityError, match=r"^Declared \(group 0, env 0\): metric 'corect' at turn 0 is not among"):
        rollout_groups(builders, engine=engine, seed=0)


def test_metric_names_must_be_a_tuple_of_names(engine, tok):
    class OneString(Counting):
        metric_names = "correct"  # a string: its letters would be the names

    with pytest.raises(TrinityError, match=r"^OneString\.metric_names must be a tuple of names, got 'correct'"):
        rollout_groups([Group(lambda r: OneString(tok, r), [{"correct": 1.0}])], engine=engine, seed=0)


def test_a_rollout_that_kept_no_episode_logs_no_env_metrics(engine, tok):
    class Broken(Declared):
        def step(self, action):
            raise ValueError("down")

    metrics = rollout_groups([Group(lambda r: Broken(tok, r), [{}])], engine=engine, seed=0).metrics
    assert metrics["rollout/dropped_groups"] == 1 and not [k for k in metrics if k.startswith(("env/", "reward/"))]


def test_the_recipes_env_workflow_logs_the_declared_names_too(engine, tok):
    """The calculator declares its counts: a batch where the model never calls the tool logs 0 calls."""
    workflow = EnvWorkflow(params=EnvWorkflowParams(env="calculator", env_args={"max_turns": 1, "max_tokens": 4}))
    tasks = [Task("What is 100 + 200?", "300", task_id="a"), Task("What is 300 + 400?", "700", task_id="b")]
    result = workflow.run(tasks, engine=engine, sampling=SamplingParams(n=2, seed=0))
    assert result.metrics["env/tool_calls"] == 0.0 and result.metrics["env/tool_errors"] == 0.0  # one turn: no call
    assert result.metrics["env/used_tool"] == 0.0 and result.metrics["env/correct"] == 0.0


@pytest.mark.parametrize("module", ["trinity_like.envs.guard", "trinity_like.envs.rollout"])
def test_docstring_examples(module):
    import doctest
    import importlib

    result = doctest.testmod(importlib.import_module(module), optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0
