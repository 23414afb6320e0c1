"""A recipe's `env` workflow, as the client loop runs the same env: its held-out evaluation logs
the env's own metrics (`eval/env/*`, the client's keys and meaning), and a training step that
drops more than `explorer.workflow_args.max_dropped_fraction` of its groups stops the run with
the first drop's error."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from cookbook.rl.core import RLTrainConfig, evaluate
from trinity_like.client.sampling import SamplingClient
from trinity_like.config import load_plan
from trinity_like.envs.dataset import build_env_factory
from trinity_like.errors import TrinityError
from trinity_like.explorer.tasks import ArithmeticParams, arithmetic_tasks
from trinity_like.plugins import load_plugins
from trinity_like.runner import run_plan

REPO = Path(__file__).resolve().parents[2]
RECIPE = REPO / "examples" / "multiturn_tool.yaml"

# `fragile`: one turn scored on the parity of the action's first token; `fail` says which group
# builders' envs raise at every step: "all", or "every_other" (the first task of each batch of 2).
PLUGIN = textwrap.dedent(
    """
    import itertools
    from dataclasses import dataclass

    from trinity_like.envs.dataset import TaskGroupBuilder
    from trinity_like.envs.types import Env, EnvFactory, StepResult, StopCondition
    from trinity_like.models.chat import render_prompt
    from trinity_like.registry import ENV


    @dataclass(frozen=True)
    class FragileParams:
        fail: str = "every_other"


    class Fragile(Env):
        metric_names = ("odd", "calls")

        def __init__(self, prompt, fails):
            self.prompt, self.fails = prompt, fails

        def initial_observation(self):
            return list(self.prompt), StopCondition(max_tokens=3)

        def step(self, action):
            if self.fails:
                raise ValueError("tool server unreachable")
            return StepResult(float(action[0] % 2), True, metrics={"odd": float(action[0] % 2)})


    @ENV.register_module("fragile")
    class FragileEnvs(EnvFactory):
        '''Fails on purpose.'''

        def __init__(self, *, tokenizer, params: FragileParams):
            self.tok, self.params, self.calls = tokenizer, params, itertools.count()

        def group_builder(self, task, group_size):
            fails = self.params.fail == "all" or next(self.calls) % 2 == 0
            prompt = render_prompt(self.tok, task.messages())
            return TaskGroupBuilder(task, group_size, lambda: Fragile(prompt, fails))
    """
)


@pytest.fixture(scope="module")
def plugin(tmp_path_factory) -> Path:
    """One file for the module: its tests share this process, where a second copy would register `fragile` twice."""
    path = tmp_path_factory.mktemp("plugin") / "fragile.py"
    path.write_text(PLUGIN)
    return path


def overrides(tmp_path: Path, plugin: Path, fail: str, *extra: str) -> list[str]:
    return [
        f"run_root={tmp_path}",
        f"plugins=[{plugin}]",
        "model.path=tiny-random",
        "trainer.engine=local",
        "trainer.total_steps=2",
        "buffer.eval_tasks.size=4",
        "explorer.batch_size=2",
        "explorer.group_size=2",
        "monitor.progress=false",
        "checkpoint.interval=2",
        f"explorer.workflow_args={{env: fragile, env_args: {{fail: {fail}}}}}",
        "algorithm.dynamic_sampling=false",
        *extra,
    ]


def logged(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_the_recipes_evaluation_logs_the_envs_metrics_as_the_client_loop_does(plugin, tmp_path, capsys):
    plan = load_plan(RECIPE, overrides(tmp_path, plugin, "every_other"))
    assert run_plan(plan) == 0
    rows = logged(Path(plan.stages[0].config.run_dir()))
    steps = [r for r in rows if "time/step" in r]
    # one group of each batch of 2 dropped: at the limit (0.5), not beyond it, so the run goes on
    assert [r["step"] for r in steps] == [1, 2]
    assert all(r["workflow/skipped_tasks"] == 1 and r["rollout/dropped_groups"] == 1 for r in steps)
    assert all(r["env/calls"] == 0.0 for r in steps)  # declared, never reported: 0
    assert capsys.readouterr().out.count("skipped: Fragile (group 0, env 0) step at turn 0: ValueError") == 2
    evals = [r for r in rows if "eval/accuracy" in r]
    assert [r["step"] for r in evals] == [0, 2]
    for r in evals:
        assert r["eval/dropped"] == 2 and r["eval/tasks"] == 4  # every other held-out task's env failed
        assert r["eval/accuracy"] == pytest.approx(r["eval/env/odd"] * 2 / 4)  # a dropped one scores 0
    # the client loop's evaluation of the same env on the same starting weights: the same keys and values
    load_plugins([str(plugin)])
    sampler = SamplingClient("tiny-random")
    factory = build_env_factory("fragile", {"fail": "every_other"}, tokenizer=sampler.get_tokenizer())
    held_out = arithmetic_tasks(ArithmeticParams(ranges=((100, 999),), template="What is {expression}?"), "eval", 4)
    client = evaluate(sampler, factory, held_out, RLTrainConfig(log_path=str(tmp_path / "client")))
    env_keys = {k for k in client if k.startswith(("eval/env/", "eval/rollout/", "eval/dropped"))}
    assert env_keys == {
        "eval/env/odd",
        "eval/env/calls",
        "eval/rollout/turns/mean",
        "eval/rollout/turns/max",
        "eval/dropped",
    }
    assert {k: evals[0][k] for k in env_keys | {"eval/accuracy"}} == {
        k: client[k] for k in env_keys | {"eval/accuracy"}
    }


def test_a_step_that_drops_most_of_its_groups_stops_the_run_with_the_first_error(plugin, tmp_path, capsys):
    plan = load_plan(RECIPE, overrides(tmp_path, plugin, "all"))
    with pytest.raises(TrinityError) as info:
        run_plan(plan)
    assert str(info.value) == (
        "step 1: 2 of 2 groups were dropped, more than explorer.workflow_args.max_dropped_fraction=0.5 allows; "
        "the first: Fragile (group 0, env 0) step at turn 0: ValueError: tool server unreachable"
    )
    rows = logged(Path(plan.stages[0].config.run_dir()))
    assert [r["step"] for r in rows] == [0]  # the evaluation at the start (every episode dropped): not stopped
    assert rows[0]["eval/dropped"] == 4 and rows[0]["eval/accuracy"] == 0.0 and "eval/env/odd" not in rows[0]


def test_a_limit_of_one_explores_through_any_drops(plugin, tmp_path):
    plan = load_plan(RECIPE, overrides(tmp_path, plugin, "all", "explorer.workflow_args.max_dropped_fraction=1.0"))
    assert run_plan(plan) == 0
    steps = [r for r in logged(Path(plan.stages[0].config.run_dir())) if "time/step" in r]
    assert [r["step"] for r in steps] == [1, 2] and all(r["skipped/empty_batch"] == 1.0 for r in steps)


@pytest.mark.parametrize("value", ["1.5", "-1", "half"])
def test_a_bad_limit_is_a_one_line_error_when_the_recipe_is_read(plugin, tmp_path, value):
    with pytest.raises(TrinityError, match=r"explorer\.workflow_args\.max_dropped_fraction"):
        load_plan(RECIPE, overrides(tmp_path, plugin, "all", f"explorer.workflow_args.max_dropped_fraction={value}"))
