"""The `env` workflow: a recipe's tasks played as multi-turn episodes of a registered env."""

from __future__ import annotations

import json
import sqlite3
import textwrap
from pathlib import Path

import pytest

from trinity_like.buffer.rows import unpack
from trinity_like.config import load_plan
from trinity_like.errors import TrinityError
from trinity_like.runner import run_plan

REPO = Path(__file__).resolve().parents[2]
RECIPE = REPO / "examples" / "multiturn_tool.yaml"

# A two-turn chat env: the model speaks, the env answers "more", the model speaks again and
# is scored on the parity of that last action's first token (so groups differ and train).
PLUGIN = textwrap.dedent(
    """
    from trinity_like.models.chat import message_tokens
    from trinity_like.envs.dataset import TaskGroupBuilder
    from trinity_like.envs.types import Env, EnvFactory, StepResult, StopCondition
    from trinity_like.models.chat import render_prompt
    from trinity_like.registry import ENV

    class TwoTurns(Env):
        def __init__(self, tok, task):
            self.tok, self.messages = tok, task.messages()
            self.history = render_prompt(tok, self.messages)
            self.stop = StopCondition(max_tokens=6)
            self.turn = 0

        def initial_observation(self):
            return list(self.history), self.stop

        def step(self, action):
            self.turn += 1
            if self.turn == 2:
                return StepResult(float(action[0] % 2), True, metrics={"spoke_twice": 1.0})
            reply = {"role": "user", "content": "more"}
            self.history += list(action) + message_tokens(self.tok, self.messages, [reply], action_tokens=action)
            self.messages = self.messages + [{"role": "assistant", "content": self.tok.decode(action)}, reply]
            return StepResult(0.0, False, list(self.history), self.stop)

    @ENV.register_module("two_turns", force=True)
    class TwoTurnEnvs(EnvFactory):
        def __init__(self, *, tokenizer):
            self.tok = tokenizer

        def group_builder(self, task, group_size):
            return TaskGroupBuilder(task, group_size, lambda: TwoTurns(self.tok, task))
    """
)

TINY = [
    "model.path=tiny-random",
    "trainer.engine=local",
    "trainer.total_steps=2",
    "buffer.eval_tasks.size=4",
    "explorer.batch_size=2",
    "explorer.group_size=4",
    "monitor.progress=false",
    "checkpoint.interval=2",
    "explorer.workflow_args={env: two_turns}",
    "algorithm.dynamic_sampling=false",
]


def test_a_recipe_trains_on_two_turn_episodes_with_only_the_policy_tokens_in_the_loss(tmp_path):
    plugin = tmp_path / "two_turns.py"
    plugin.write_text(PLUGIN)
    plan = load_plan(RECIPE, [f"run_root={tmp_path}", f"plugins=[{plugin}]", *TINY])
    assert run_plan(plan) == 0
    run_dir = Path(plan.stages[0].config.run_dir())
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "rollout/turns/mean" in r]
    assert len(steps) == 2 and all(r["rollout/turns/mean"] == 2.0 for r in steps)
    assert all(r["env/spoke_twice"] == 1.0 and r["workflow/skipped_tasks"] == 0 for r in steps)
    assert any(r["actor/grad_norm"] > 0 for r in steps)  # rewards differed within a group: the policy was trained
    with sqlite3.connect(run_dir / "buffer.sqlite") as db:
        stored = [unpack(*row) for row in db.execute("select kind, header, arrays from rows")]
    assert len(stored) == 2 * 2 * 4 and all(e.info["turns"] == 2 for e in stored)  # 2 steps x 2 tasks x 4 episodes
    for e in stored:
        mask = e.action_mask
        assert mask[0] == 1 and mask[-1] == 1 and 0 in mask  # the env's "more" is context, not loss
        assert e.task_id and e.info["answer"] is not None


def test_the_explorer_keeps_finished_turns_for_env_workflows_only(tmp_path):
    from trinity_like.config.engine_params import explorer_params
    from trinity_like.explorer.worker import ExplorerWorker
    from trinity_like.models.resolve import resolve_model_path

    path = str(resolve_model_path("tiny-random"))
    env = load_plan(RECIPE, ["model.path=tiny-random"]).stages[0].config
    math = load_plan(REPO / "examples" / "grpo_arith.yaml", ["model.path=tiny-random"]).stages[0].config
    assert ExplorerWorker(explorer_params(env), path).engine.params.prefix_cache_tokens > 0
    assert ExplorerWorker(explorer_params(math), path).engine.params.prefix_cache_tokens == 0


@pytest.mark.parametrize(
    "override, message",
    [
        (
            "explorer.workflow_args={env: calculater}",
            r"multiturn_tool.yaml: override .*explorer.workflow_args.env: unknown environment 'calculater'; did you mean 'calculator'",
        ),
        (
            "explorer.workflow_args={env: calculator, env_args: {max_turn: 2}}",
            r"explorer.workflow_args.env_args.max_turn: unknown parameter .*did you mean 'max_turns'",
        ),
        ("explorer.workflow_args={max_turns: 0}", r"max_turns must be >= 1"),
    ],
)
def test_bad_workflow_args_are_one_line_errors_when_the_recipe_is_read(override, message):
    with pytest.raises(TrinityError, match=message):
        load_plan(RECIPE, [override])


def test_the_dry_run_plan_prints_what_the_env_workflow_runs(tok):
    """The plan shows the env's own action limit and reward (not `reward=` and `max_new_tokens=`, which do
    not apply), read from the params the explorer builds the workflow with; the env then stops at it."""
    from trinity_like.config import describe_plan
    from trinity_like.config.engine_params import workflow_params
    from trinity_like.envs.workflow import EnvWorkflow
    from trinity_like.experience import Task

    plan = load_plan(RECIPE, ["explorer.workflow_args.env_args.max_tokens=24", "model.max_response_tokens=100"])
    (line,) = [ln for ln in describe_plan(plan).splitlines() if ln.startswith("  explorer:")]
    assert "reward=" not in line and "max_new_tokens" not in line
    config = plan.stages[0].config
    workflow = EnvWorkflow(params=workflow_params(config, EnvWorkflow))  # as ExplorerWorker builds it
    p = workflow.params
    assert f"env={p.env} (Arithmetic with a calculator tool" in line  # the env's reward is its own
    assert f"max_turns={p.env_args['max_turns']}, max_tokens=24," in line
    assert f"episodes <= {p.max_total_tokens} tokens and {p.max_turns} turns" in line and p.max_total_tokens == 356
    assert f"step_timeout_s={p.step_timeout_s:g}, step_retries={p.step_retries}" in line
    s = config.explorer.sampling
    assert f"T={s.temperature}, top_k={s.top_k}, top_p={s.top_p}" in line
    env = workflow.factory(tok).group_builder(Task("What is 100 + 200?", "300"), 1).make_envs()[0]
    assert env.initial_observation()[1].max_tokens == 24  # what the plan said is what stops an action
    math = load_plan(REPO / "examples" / "grpo_arith.yaml")
    (line,) = [ln for ln in describe_plan(math).splitlines() if ln.startswith("  explorer:")]
    assert "reward=exact_match" in line and "max_new_tokens=16" in line  # a workflow without a plan_text
