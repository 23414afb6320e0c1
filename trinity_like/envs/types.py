"""The environment API: what an env is, what a step returns, and what a rollout records.

An environment is written once and run from either front door -- a recipe's explorer or
a researcher's own loop over the Tinker-compatible client -- so it speaks in token ids,
never in text the framework would re-tokenise (token in, token out). The semantics follow
tinker-cookbook's ``rl/types.py``; the code is our own.

- :class:`Env` is one episode with one agent: an initial observation, then ``step`` per
  action until ``episode_done``. An observation is the *whole* token history the policy
  samples from; the next observation of a multi-turn env extends the previous one plus
  the action, token for token (the rollout checks it). Training then scores exactly the
  tokens the sampler saw: the multi-turn tokenisation drift that verl and TRL had to fix
  (re-rendering a conversation does not give back the tokens that were sampled) cannot
  happen by construction.
- :class:`EnvGroupBuilder` builds the envs of one group: copies of one task whose
  rewards are compared with each other (GRPO's baseline is the group's mean), or the
  players of one game. ``compute_group_rewards`` sees the whole group's trajectories, so
  a reward may be relative (a pairwise judge, a zero-sum game).
- :class:`RLDataset` hands out batches of group builders; :class:`EnvFactory` is what
  the ``ENV`` registry holds -- it turns a task into a group builder.

Letters in names: G envs in a group.
"""

from __future__ import annotations

import abc
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from trinity_like.errors import TrinityError
from trinity_like.experience import Task

Metrics = dict[str, float]


@dataclass(frozen=True)
class StopCondition:
    """Where sampling of one action stops: a stop token, a stop string, or ``max_tokens``.

    ``stop_token_ids=None`` means the model's own end-of-turn/eos ids (what the engine
    stops at by default); an empty tuple means no stop token at all.

    >>> StopCondition(max_tokens=32, stop_strings=("</calc>",)).stop_strings
    ('</calc>',)
    >>> StopCondition(max_tokens=0)
    Traceback (most recent call last):
    ...
    trinity_like.errors.TrinityError: StopCondition.max_tokens must be >= 1, got 0
    """

    max_tokens: int = 64  # most tokens one action may have; reaching it finishes with "length"
    stop_token_ids: tuple[int, ...] | None = None  # None: the model's eos/end-of-turn ids
    stop_strings: tuple[str, ...] = ()  # finish once the action's text contains one

    def __post_init__(self) -> None:
        if not isinstance(self.max_tokens, int) or self.max_tokens < 1:
            raise TrinityError(f"StopCondition.max_tokens must be >= 1, got {self.max_tokens!r}")
        if self.stop_token_ids is not None:
            object.__setattr__(self, "stop_token_ids", tuple(int(t) for t in self.stop_token_ids))
        if isinstance(self.stop_strings, str) or not all(isinstance(s, str) and s for s in self.stop_strings):
            raise TrinityError(f"StopCondition.stop_strings must be non-empty strings, got {self.stop_strings!r}")
        object.__setattr__(self, "stop_strings", tuple(self.stop_strings))


@dataclass
class StepResult:
    """What an env answers to one action.

    ``next_observation`` is the full token history to sample the next action from: it must
    start with the previous observation followed by the action (only new tokens -- a tool's
    output, the other player's words, the chat template's framing -- are appended). When
    ``episode_done`` it may be empty. ``metrics`` are summed over an episode's steps and
    then averaged over episodes: report a per-episode quantity (``correct``) once, on the
    last step, and a per-step count (``tool_calls``) on every step.

    >>> StepResult(reward=1.0, episode_done=True).next_observation
    []
    """

    reward: float  # this step's reward; an episode's return adds the group reward to their sum
    episode_done: bool  # no further action is asked for
    next_observation: list[int] = field(default_factory=list)  # the whole history so far, extended
    next_stop_condition: StopCondition = field(default_factory=StopCondition)  # for the next action
    metrics: Metrics = field(default_factory=dict)  # numbers, summed over the episode


class Env(abc.ABC):
    """One episode with one agent; stateful, used once and thrown away.

    Observations are token ids (the whole history the policy samples from), actions are
    the sampled token ids (the stop token included when sampling stopped at one).

    >>> class Countdown(Env):
    ...     '''Asks for three actions; the reward is the number of tokens it got.'''
    ...     def __init__(self):
    ...         self.history, self.turns = [1, 2, 3], 0
    ...     def initial_observation(self):
    ...         return list(self.history), StopCondition(max_tokens=4)
    ...     def step(self, action_tokens):
    ...         self.turns += 1
    ...         self.history += list(action_tokens) + [7]  # the observation adds one token
    ...         done = self.turns == 3
    ...         return StepResult(float(len(action_tokens)), done, list(self.history), StopCondition(max_tokens=4))
    >>> env = Countdown()
    >>> env.initial_observation()
    ([1, 2, 3], StopCondition(max_tokens=4, stop_token_ids=None, stop_strings=()))
    >>> env.step([5, 6]).next_observation
    [1, 2, 3, 5, 6, 7]
    """

    concurrent_steps: bool = False
    """True: the rollout may run this env's ``step`` at the same time as other episodes'
    steps (each in its own thread), so a step that waits on a model or a server can be
    batched with the others' (see :class:`~cookbook.envs.twenty_questions.Answerer`).
    Set it only when steps of different envs share nothing unguarded."""

    metric_names: tuple[str, ...] = ()
    """The step metrics this env reports (``("correct", "tool_calls")``). Each is logged as
    ``env/<name>`` in every rollout that kept an episode -- 0 for an episode that never
    reported it, so a count nobody incurred is 0, not a gap in the plot -- and reporting a
    name not declared here is a contract error. Left empty, whatever the episodes report is
    logged (a name is then absent from a rollout where no episode reported it)."""

    @abc.abstractmethod
    def initial_observation(self) -> tuple[list[int], StopCondition]:
        """The prompt's token ids and where the first action stops."""

    @abc.abstractmethod
    def step(self, action_tokens: list[int]) -> StepResult:
        """Apply one sampled action; the reward, whether the episode ended, what comes next."""


@dataclass
class Transition:
    """One turn as the rollout saw it: the history sampled from, the action, its reward.

    >>> t = Transition([1, 2], [3, 4], [-0.5, -0.1], reward=1.0, episode_done=True)
    >>> t.observation + t.action
    [1, 2, 3, 4]
    """

    observation: list[int]  # the prompt of this turn: the whole history so far
    action: list[int]  # sampled token ids
    logprobs: list[float]  # per action token, under the sampling distribution
    reward: float
    episode_done: bool  # as the env reported it (a rollout limit may end an episode without it)
    metrics: Metrics = field(default_factory=dict)
    finish_reason: str = ""  # the sampler's: "stop" | "length"
    model_version: int = 0  # version of the weights that sampled the action
    weights_digest: str = ""  # the engine's digest of those weights


@dataclass
class Trajectory:
    """One episode: its transitions and the observation after the last action.

    ``end_reason`` says why the episode ended: ``"done"`` (the env said so), ``"max_turns"``
    or ``"context"`` (a rollout limit ended it cleanly).

    >>> traj = Trajectory([Transition([1], [2], [-0.1], 0.5, True)], final_observation=[1, 2])
    >>> traj.total_reward(), traj.end_reason
    (0.5, 'done')
    """

    transitions: list[Transition]
    final_observation: list[int]
    end_reason: str = "done"

    def total_reward(self) -> float:
        """The sum of the step rewards (the group reward is added by the group's owner)."""
        return sum(t.reward for t in self.transitions)


class EnvGroupBuilder(abc.ABC):
    """Builds the envs of one group, and optionally rewards them as a group.

    Why groups: GRPO-style advantages centre each episode's return on its group's mean, so
    a group is usually G copies of one task; a group may also be the players of one game,
    whose rewards only make sense together (``compute_group_rewards`` sees them all).
    An episode's return is the sum of its step rewards plus its group reward.

    >>> class OneShot(Env):
    ...     def initial_observation(self):
    ...         return [1, 2, 3], StopCondition(max_tokens=4)
    ...     def step(self, action_tokens):
    ...         return StepResult(0.0, episode_done=True)
    >>> class Pair(EnvGroupBuilder):
    ...     '''Two players; the one with the longer final observation gets 1.'''
    ...     def make_envs(self):
    ...         return [OneShot(), OneShot()]
    ...     def compute_group_rewards(self, trajectories):
    ...         lengths = [len(t.final_observation) for t in trajectories]
    ...         return [float(n == max(lengths)) for n in lengths]
    >>> trajectories = [Trajectory([], [1, 2, 3, 4]), Trajectory([], [1, 2, 3])]
    >>> len(Pair().make_envs()), Pair().compute_group_rewards(trajectories), Pair().logging_tags()
    (2, [1.0, 0.0], [])
    """

    @abc.abstractmethod
    def make_envs(self) -> Sequence[Env]:
        """Fresh envs for one group (each is used for one episode)."""

    def compute_group_rewards(self, trajectories: Sequence[Trajectory]) -> list[float]:
        """One reward per trajectory, added to its step rewards; zero by default."""
        return [0.0] * len(trajectories)

    def logging_tags(self) -> list[str]:
        """Short names (a dataset, a difficulty) the group's metrics are also reported under."""
        return []


class RLDataset(abc.ABC):
    """Batches of group builders: batch ``i`` is what one training iteration rolls out.

    >>> class Numbers(EnvGroupBuilder):
    ...     def __init__(self, n):
    ...         self.n = n
    ...     def make_envs(self):
    ...         return []  # envs of the n-th task, omitted here
    >>> class Batches(RLDataset):
    ...     '''Ten batches of four groups each.'''
    ...     def get_batch(self, index):
    ...         return [Numbers(4 * index + i) for i in range(4)]
    ...     def __len__(self):
    ...         return 10
    >>> len(Batches()), [b.n for b in Batches().get_batch(2)]
    (10, [8, 9, 10, 11])
    """

    @abc.abstractmethod
    def get_batch(self, index: int) -> Sequence[EnvGroupBuilder]:
        """The group builders of batch ``index`` (0 <= index < len(self))."""

    @abc.abstractmethod
    def __len__(self) -> int:
        """The number of batches."""


class EnvFactory(abc.ABC):
    """What an ``ENV`` registry entry is: built once with a tokenizer and its params, it
    turns one task into a group builder (a recipe's tasks come from the buffer; a client
    loop's from any task source, see :class:`~trinity_like.envs.dataset.TaskEnvDataset`).

    >>> class Copies(EnvGroupBuilder):
    ...     def __init__(self, task, group_size):
    ...         self.task, self.group_size = task, group_size
    ...     def make_envs(self):
    ...         return []  # group_size envs asking self.task, omitted here
    >>> class CopiesOfTheTask(EnvFactory):
    ...     '''G copies of the task.'''
    ...     def __init__(self, *, tokenizer=None):
    ...         self.tokenizer = tokenizer
    ...     def group_builder(self, task, group_size):
    ...         return Copies(task, group_size)
    >>> CopiesOfTheTask().group_builder(Task("What is 1 + 1?", "2"), 8).group_size
    8
    """

    @abc.abstractmethod
    def group_builder(self, task: Task, group_size: int) -> EnvGroupBuilder:
        """A builder of ``group_size`` envs for ``task``."""


def check_tokens(value: Any, what: str) -> list[int]:
    """``value`` as a list of ints, or a one-line TrinityError naming ``what``."""
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        raise TrinityError(f"{what} must be a list of token ids, got {type(value).__name__}")
    if not all(isinstance(t, int) and not isinstance(t, bool) for t in value):
        bad = next(t for t in value if not isinstance(t, int) or isinstance(t, bool))
        raise TrinityError(f"{what} must hold int token ids, got {type(bad).__name__} {bad!r}")
    return list(value)


def check_reward(value: Any, what: str) -> float:
    """``value`` as a finite float, or a one-line TrinityError naming ``what``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise TrinityError(f"{what} must be a finite number, got {value!r}")
    return float(value)
