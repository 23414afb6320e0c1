"""The ``env`` workflow: a recipe's tasks played as episodes of an ``ENV`` environment.

This is how ``run --config`` reaches the environments the client loop uses: the same
:class:`~trinity_like.envs.types.EnvFactory` turns each task into a group of
``explorer.group_size`` envs, :func:`~trinity_like.envs.rollout.rollout_groups` plays them
on the explorer's engine (multi-turn, token in, token out), and each episode becomes one
experience row whose loss covers the policy's tokens only. A recipe::

    explorer:
      workflow: env
      workflow_args: {env: calculator, env_args: {max_turns: 3}}

Limits come from the recipe: an episode's tokens stop at ``model.max_prompt_tokens +
model.max_response_tokens`` (the length the trainer's rows are cut to) unless
``workflow_args.max_total_tokens`` says otherwise, the actions' sampling is
``explorer.sampling`` (``explorer.eval_sampling`` for held-out tasks; each action's length
and stops are the env's) and the rollout seed the step's. The env scores its own steps:
``explorer.reward_fn`` and ``sampling.max_new_tokens`` do not apply, and ``--dry-run``
prints what does (:meth:`EnvWorkflow.plan_text`). A group the env could not finish (its
steps raised or timed out, see :mod:`~trinity_like.envs.rollout`) is a skipped task, as a
task whose reward failed is in the ``math`` workflow; a training step that skips more than
``max_dropped_fraction`` of its tasks stops the run with the first one's error
(:func:`check_step`).

The rollout engine keeps the keys and values of finished turns for the next turn's
prompt (its prefix cache), so a turn prefills only the tokens the env added.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from trinity_like.components import build_params
from trinity_like.envs.dataset import build_env_factory
from trinity_like.envs.experience import group_rows
from trinity_like.envs.guard import check_dropped, check_fraction
from trinity_like.envs.rollout import RolloutParams, rollout_groups
from trinity_like.envs.types import EnvFactory
from trinity_like.errors import ConfigError, TrinityError
from trinity_like.explorer.workflows import SkippedTask, WorkflowResult, workflow_metrics
from trinity_like.registry import ENV, WORKFLOW, UnknownNameError, first_line

if TYPE_CHECKING:
    from trinity_like.config.schema import Config
    from trinity_like.explorer.engine import RolloutEngine, SamplingParams


@dataclass(frozen=True)
class EnvWorkflowParams:
    """Which environment, and the limits of its episodes (the recipe's ``explorer.workflow_args``)."""

    env: str = "calculator"  # ENV name (the cookbook pack's calculator by default, looked up like any)
    env_args: Mapping[str, Any] = field(default_factory=dict)  # params of that env
    max_total_tokens: int = 2048  # tokens of a whole episode; a recipe: model.max_prompt_tokens + max_response_tokens
    step_timeout_s: float = 60.0  # time limit of one env call
    step_retries: int = 1  # further attempts after an env call raised; then its group is skipped
    max_turns: int = 64  # actions per episode, a safety net over the env's own end
    max_dropped_fraction: float = 0.5  # a training step skipping more of its tasks (env failures) stops the run

    def __post_init__(self) -> None:
        # A wrong env name or env_args fails when the recipe is read, not at the first step.
        try:
            env = ENV.get(self.env)
        except UnknownNameError as exc:
            raise ConfigError(f"explorer.workflow_args.env: {exc.args[0]}") from None
        build_params(env, self.env_args, where="explorer.workflow_args.env_args")
        try:
            check_fraction(self.max_dropped_fraction, "max_dropped_fraction")
        except TrinityError as exc:
            raise ConfigError(f"explorer.workflow_args.{exc}") from None
        RolloutParams(
            max_turns=self.max_turns,
            max_total_tokens=self.max_total_tokens,
            step_timeout_s=self.step_timeout_s,
            step_retries=self.step_retries,
        )


@WORKFLOW.register_module("env")
class EnvWorkflow:
    """Tasks as groups of multi-turn episodes of a registered environment."""

    reuses_prefixes = True  # later turns extend earlier ones: the engine should keep their keys

    def __init__(self, *, params: EnvWorkflowParams) -> None:
        self.params = params
        self._factory: EnvFactory | None = None
        self._tokenizer = None

    @classmethod
    def plan_text(cls, config: Config) -> str:
        """What ``--dry-run`` prints of this workflow: the env (its reward is its own, its
        params hold its action limits), the episode limits and the sampling -- built from the
        params the explorer builds it with (:func:`~trinity_like.config.engine_params.workflow_params`)."""
        from trinity_like.config.engine_params import workflow_params  # the explorer's own: what runs is what prints

        p = workflow_params(config, cls)
        env = ENV.get(p.env)
        params = build_params(env, p.env_args, where="explorer.workflow_args.env_args")
        s, ev = config.explorer.sampling, config.explorer.eval_sampling
        return (
            f"env={p.env} ({first_line(env).rstrip('.')}) {_params_text(params)}; the env scores its own steps "
            f"and sets each action's length; episodes <= {p.max_total_tokens} tokens and {p.max_turns} turns, "
            f"step_timeout_s={p.step_timeout_s:g}, step_retries={p.step_retries}, "
            f"max_dropped_fraction={p.max_dropped_fraction:g}; T={s.temperature}, top_k={s.top_k}, top_p={s.top_p} "
            f"(eval: T={ev.temperature})"
        )

    def factory(self, tokenizer: Any) -> EnvFactory:
        """The env factory, built once per tokenizer (envs render their prompts with it)."""
        if self._factory is None or self._tokenizer is not tokenizer:
            self._factory = build_env_factory(
                self.params.env, self.params.env_args, tokenizer=tokenizer, where="explorer.workflow_args.env_args"
            )
            self._tokenizer = tokenizer
        return self._factory

    def run(self, tasks: Sequence[Any], *, engine: RolloutEngine, sampling: SamplingParams) -> WorkflowResult:
        factory = self.factory(engine.tokenizer)
        builders = [factory.group_builder(task, sampling.n) for task in tasks]
        params = RolloutParams(
            temperature=sampling.temperature,
            top_k=sampling.top_k,
            top_p=sampling.top_p,
            greedy=sampling.greedy,
            max_turns=self.params.max_turns,
            max_total_tokens=self.params.max_total_tokens,
            step_timeout_s=self.params.step_timeout_s,
            step_retries=self.params.step_retries,
        )
        result = rollout_groups(builders, engine=engine, seed=sampling.seed, params=params)
        experiences = [
            row
            for group in result.groups
            for row in group_rows(group, task_id=tasks[group.index].task_id, answer=tasks[group.index].answer)
        ]
        skipped = [SkippedTask(tasks[d.index].task_id, d.reason) for d in result.dropped]
        # No reward function here: the env scores its own steps (rollout/env_errors count its failures).
        metrics = {
            **result.metrics,
            **workflow_metrics(experiences, len(tasks), skipped, {"timeout": 0, "error": 0}, retried=0),
        }
        return WorkflowResult(experiences, skipped, metrics)


def _params_text(params: Any) -> str:
    """``(max_turns=3, max_tokens=48, ...)``; long strings shortened (a system prompt)."""
    if params is None:
        return "(no params)"
    values = dataclasses.asdict(params) if dataclasses.is_dataclass(params) else {}
    shown = [f"{k}={(v[:37] + '...') if isinstance(v, str) and len(v) > 40 else v!r}" for k, v in values.items()]
    return "(" + ", ".join(shown) + ")"


def check_step(config: Config, skipped: Sequence[SkippedTask], tasks: int, step: int) -> None:
    """A recipe's training step (``tasks`` explored, ``skipped`` of them) against the workflow's
    ``max_dropped_fraction``: more skipped stops the run with the first one's reason. A workflow
    whose params declare no such field (``math``) is not checked."""
    from trinity_like.config.engine_params import workflow_params

    if not skipped:
        return
    limit = getattr(workflow_params(config, WORKFLOW.get(config.explorer.workflow)), "max_dropped_fraction", None)
    if limit is not None:
        check_dropped(
            len(skipped),
            tasks,
            skipped[0].reason,
            max_fraction=limit,
            where=f"step {step}",
            knob="explorer.workflow_args.max_dropped_fraction",
        )
