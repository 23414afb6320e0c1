"""Running groups of episodes on the rollout engine, token in, token out.

Every turn, the next action of *every* running episode, of every group, is sampled in one
engine call (one per distinct stop condition, which is one in practice), so the engine's
continuous batching sees the whole batch. Each prompt is the episode's whole token
history: nothing is re-tokenised or cached here -- reusing the keys and values of a
history the engine has seen is the engine's business. Env steps then run one after the
other, each in its own thread under a time limit -- or, for envs that declare
``concurrent_steps``, all at once (a step waiting on another model is then batched
with the others'; results are still taken in episode order).

Randomness: the action of episode ``(group g, env i)`` at turn ``t`` is drawn from its own
seed, :func:`episode_seed`; it does not depend on which other episodes share the call. At
turn 0 it is the seed ``generate(engine, ..., SamplingParams(seed=seed))`` gives sample ``i``
of prompt ``g``, so a single-turn env samples exactly what a workflow samples.

Limits end an episode cleanly (it is kept, with ``Trajectory.end_reason``): ``max_turns``
actions, or a history reaching ``max_total_tokens`` (an action is cut to fit). An env is
user code: a step that raises is retried ``step_retries`` times, then its episode -- and
its whole group, since a group with a missing member would bias its baseline -- is
dropped and counted; a step past ``step_timeout_s`` drops the group at once (the call
still runs in its thread and holds the env, so it cannot be retried). A broken contract
(an observation that does not extend the history, a non-finite reward) or a TrinityError
from the env is a bug to fix, not bad luck: it stops the rollout with a one-line error.

Example::

    result = rollout_groups(builders, engine=engine, seed=step, params=RolloutParams(max_turns=4))
    for group in result.groups:
        group.trajectories, group.group_rewards, group.total_rewards()
    result.dropped   # [DroppedGroup(index, reason), ...]
    result.metrics   # rollout/turns/mean, rollout/tokens/mean, rollout/env_errors, env/<step metric>, ...

Metrics: ``rollout/*`` count groups, episodes, turns, tokens (a whole episode's), env
failures and engine calls; ``reward/mean|std`` are over episode returns; ``env/<key>`` is
a step metric summed over each episode and averaged over the kept episodes, an episode that
did not report it counting 0; ``tag/<tag>/...`` the same over the groups whose builder
reports that logging tag. The keys are the names the envs declare (``Env.metric_names``:
each is logged whenever an episode was kept, 0 when none reported it) and any other name
an episode reported. A rollout that kept no episode has no ``reward/*`` or ``env/*``.
"""

from __future__ import annotations

import hashlib
import statistics
import uuid
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from trinity_like.envs.guard import DroppedGroup, EnvCalls, call_env
from trinity_like.envs.types import (
    Env,
    EnvGroupBuilder,
    StepResult,
    StopCondition,
    Trajectory,
    Transition,
    check_reward,
    check_tokens,
)
from trinity_like.errors import TrinityError
from trinity_like.explorer.engine import Request, RolloutEngine, SamplingParams, sample_seed

END_REASONS = ("done", "max_turns", "context")


@dataclass(frozen=True)
class RolloutParams:
    """How actions are sampled, and the limits that end an episode (the table in ``docs/envs.md``).

    A client loop gets them from ``RLTrainConfig.rollout()`` (temperature 1 when training,
    greedy when evaluating); a recipe's ``env`` workflow takes the sampling fields from
    ``explorer.sampling`` (``explorer.eval_sampling`` when evaluating) and the limits from
    ``explorer.workflow_args``. How long one action may be and where it stops is the env's
    own :class:`~.types.StopCondition`, not a field here. An episode a limit ends is kept
    (``Trajectory.end_reason``); a group whose env failed is dropped (``rollout/dropped_groups``).
    """

    temperature: float = 1.0  # logits are divided by it before sampling; > 0 unless greedy
    top_k: int = 0  # sample among the k most likely tokens only; 0: all
    top_p: float = 1.0  # sample among the fewest most likely tokens holding this mass; 1.0: all
    greedy: bool = False  # argmax decoding (the three above unused); evaluation uses it
    max_turns: int = 8  # actions per episode; then it ends, kept, end_reason "max_turns"
    max_total_tokens: int = 2048  # history + actions; reaching it cuts the action, ends the episode ("context")
    step_timeout_s: float = 60.0  # seconds one env call may take; past it the group is dropped at once
    step_retries: int = 1  # further attempts after an env call raised; then the group is dropped

    def __post_init__(self) -> None:
        for name in ("max_turns", "max_total_tokens"):
            if getattr(self, name) < 1:
                raise TrinityError(f"RolloutParams.{name} must be >= 1, got {getattr(self, name)}")
        if not self.step_timeout_s > 0:
            raise TrinityError(f"RolloutParams.step_timeout_s must be > 0, got {self.step_timeout_s}")
        if self.step_retries < 0:
            raise TrinityError(f"RolloutParams.step_retries must be >= 0, got {self.step_retries}")
        self.sampling(1)  # temperature, top-k/p checked where the engine checks them

    def sampling(self, max_new_tokens: int, stop: StopCondition | None = None) -> SamplingParams:
        """The engine's sampling params for one call (``n`` and ``seed`` are unused: each request
        carries its own seeds)."""
        stop = stop or StopCondition()
        return SamplingParams(
            n=1,
            max_new_tokens=max_new_tokens,
            temperature=self.temperature,
            top_k=self.top_k,
            top_p=self.top_p,
            greedy=self.greedy,
            stop_token_ids=stop.stop_token_ids,
            stop_strings=stop.stop_strings,
        )


@dataclass
class GroupRollout:
    """The episodes of one group builder, and their group rewards."""

    index: int  # position of the builder in the call
    builder: EnvGroupBuilder
    trajectories: list[Trajectory]
    group_rewards: list[float]
    group_id: str = field(default_factory=lambda: uuid.uuid4().hex)  # shared by the group's experiences

    def total_rewards(self) -> list[float]:
        """Each episode's return: its step rewards plus its group reward."""
        return [t.total_reward() + r for t, r in zip(self.trajectories, self.group_rewards)]


@dataclass
class RolloutResult:
    """What one rollout produced: the kept groups in builder order, the dropped ones, metrics."""

    groups: list[GroupRollout]
    dropped: list[DroppedGroup]
    metrics: dict[str, float]


def episode_seed(seed: int, group: int, member: int, turn: int) -> int:
    """The sampling seed of one action; turn 0 matches ``sample_seed(seed, group, member)``."""
    if turn == 0:
        return sample_seed(seed, group, member)
    digest = hashlib.blake2b(f"{seed}:{group}:{member}:turn{turn}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


# -- episodes ---------------------------------------------------------------------------------------
@dataclass(eq=False)
class _Episode:
    group: int
    member: int
    env: Env
    observation: list[int] = field(default_factory=list)
    stop: StopCondition = field(default_factory=StopCondition)
    transitions: list[Transition] = field(default_factory=list)
    end_reason: str = ""  # "" while it runs
    final_observation: list[int] = field(default_factory=list)

    @property
    def name(self) -> str:
        return f"{type(self.env).__name__} (group {self.group}, env {self.member})"


@dataclass
class _Action:
    tokens: list[int]
    logprobs: list[float]
    finish_reason: str
    model_version: int
    weights_digest: str


def _sample(
    engine: RolloutEngine, episodes: list[_Episode], turn: int, seed: int, params: RolloutParams
) -> tuple[list[_Action], int]:
    """The next action of each episode, and the number of engine calls it took.

    Episodes with the same prompt share one request (the engine prefills it once). The
    call samples up to the largest room left; an action longer than its own episode's room
    is cut to it, which is what sampling with that cap would have given (a sample's tokens
    depend on its seed and prompt only).
    """
    by_stop: dict[tuple[Any, ...], list[int]] = {}
    for k, ep in enumerate(episodes):
        by_stop.setdefault((ep.stop.stop_token_ids, ep.stop.stop_strings), []).append(k)
    actions: list[_Action | None] = [None] * len(episodes)
    for members in by_stop.values():
        prompts: dict[tuple[int, ...], int] = {}
        seeds: list[list[int]] = []
        where: list[tuple[int, int]] = []
        caps = []
        for k in members:
            ep = episodes[k]
            caps.append(min(ep.stop.max_tokens, params.max_total_tokens - len(ep.observation)))
            r = prompts.setdefault(tuple(ep.observation), len(seeds))
            if r == len(seeds):
                seeds.append([])
            where.append((r, len(seeds[r])))
            seeds[r].append(episode_seed(seed, ep.group, ep.member, turn))
        requests = [Request(prompt, tuple(s)) for prompt, s in zip(prompts, seeds)]
        out = engine.run(requests, params.sampling(max(caps), episodes[members[0]].stop))
        for k, cap, (r, s) in zip(members, caps, where):
            sample = out[r][s]
            cut = len(sample.token_ids) > cap
            actions[k] = _Action(
                list(sample.token_ids[:cap]),
                list(sample.logprobs[:cap]),
                "length" if cut else sample.finish_reason,
                sample.model_version,
                sample.weights_digest,
            )
    return [a for a in actions if a is not None], len(by_stop)


def _declared(env: Env) -> tuple[str, ...]:
    names = env.metric_names
    if isinstance(names, str) or not all(isinstance(n, str) and n for n in names):
        raise TrinityError(f"{type(env).__name__}.metric_names must be a tuple of names, got {names!r}")
    return tuple(names)


def _extends(history: list[int], observation: list[int]) -> bool:
    return len(observation) >= len(history) and observation[: len(history)] == history


Failure = tuple[str, str]  # where an episode failed ("MyEnv (group 3, env 1) step at turn 2") and what failed


def _start(ep: _Episode, params: RolloutParams, calls: EnvCalls) -> Failure | None:
    """Fetch the initial observation; None, or why the episode cannot start."""
    value, error = call_env(
        ep.env.initial_observation, timeout_s=params.step_timeout_s, retries=params.step_retries, counts=calls
    )
    if error:
        return f"{ep.name} initial_observation", error
    if not isinstance(value, tuple) or len(value) != 2 or not isinstance(value[1], StopCondition):
        raise TrinityError(
            f"{ep.name}: initial_observation() must return (token ids, StopCondition), got {type(value).__name__}"
        )
    ep.observation = check_tokens(value[0], f"{ep.name}: the initial observation")
    ep.stop = value[1]
    if not ep.observation:
        raise TrinityError(f"{ep.name}: the initial observation is empty")
    if len(ep.observation) >= params.max_total_tokens:
        return ep.name, (
            f"the initial observation has {len(ep.observation)} tokens, no room under "
            f"max_total_tokens={params.max_total_tokens}"
        )
    return None


def _step(ep: _Episode, action: _Action, params: RolloutParams, calls: EnvCalls) -> Failure | None:
    """Apply one action; None, or why the episode failed (its group is then dropped)."""
    turn = len(ep.transitions)
    result, error = call_env(
        lambda: ep.env.step(list(action.tokens)),
        timeout_s=params.step_timeout_s,
        retries=params.step_retries,
        counts=calls,
    )
    if error:
        return f"{ep.name} step at turn {turn}", error
    if not isinstance(result, StepResult):
        raise TrinityError(f"{ep.name}: step() must return a StepResult, got {type(result).__name__}")
    reward = check_reward(result.reward, f"{ep.name}: the reward at turn {turn}")
    history = ep.observation + action.tokens
    nxt = check_tokens(result.next_observation, f"{ep.name}: the observation after turn {turn}")
    if (nxt or not result.episode_done) and not _extends(history, nxt):
        raise TrinityError(
            f"{ep.name}: the observation after turn {turn} does not extend the previous observation + action "
            f"({len(nxt)} tokens, expected a prefix of {len(history)}); token in, token out: append, never re-render"
        )
    if not isinstance(result.next_stop_condition, StopCondition):
        raise TrinityError(f"{ep.name}: next_stop_condition must be a StopCondition at turn {turn}")
    metrics = {str(k): check_reward(v, f"{ep.name}: metric {k!r}") for k, v in dict(result.metrics).items()}
    declared = _declared(ep.env)
    if declared and not set(metrics) <= set(declared):
        raise TrinityError(
            f"{ep.name}: metric {sorted(set(metrics) - set(declared))[0]!r} at turn {turn} is not among "
            f"its metric_names {tuple(declared)}; declare it"
        )
    ep.transitions.append(
        Transition(
            list(ep.observation),
            action.tokens,
            action.logprobs,
            reward,
            bool(result.episode_done),
            metrics,
            action.finish_reason,
            action.model_version,
            action.weights_digest,
        )
    )
    if result.episode_done:
        ep.end_reason, ep.final_observation = "done", nxt or history
    elif len(ep.transitions) >= params.max_turns:
        ep.end_reason, ep.final_observation = "max_turns", nxt
    elif len(nxt) >= params.max_total_tokens:
        ep.end_reason, ep.final_observation = "context", nxt
    else:
        ep.observation, ep.stop = nxt, result.next_stop_condition
    return None


# -- the rollout ---------------------------------------------------------------------------------------
def rollout_groups(
    builders: Sequence[EnvGroupBuilder], *, engine: RolloutEngine, seed: int, params: RolloutParams = RolloutParams()
) -> RolloutResult:
    """Run every env of every builder to the end of its episode; see the module docstring."""
    calls = EnvCalls()
    episodes: list[list[_Episode]] = []
    for g, builder in enumerate(builders):
        if not isinstance(builder, EnvGroupBuilder):
            raise TrinityError(f"rollout_groups: builder {g} is a {type(builder).__name__}, not an EnvGroupBuilder")
        envs = list(builder.make_envs())
        if not envs or not all(isinstance(env, Env) for env in envs):
            raise TrinityError(f"{type(builder).__name__} (group {g}): make_envs() must return a non-empty list of Env")
        episodes.append([_Episode(g, i, env) for i, env in enumerate(envs)])
    dropped: dict[int, DroppedGroup] = {}

    def drop(ep: _Episode, failure: Failure | None) -> None:
        if failure is not None and ep.group not in dropped:
            where, error = failure
            dropped[ep.group] = DroppedGroup(ep.group, f"{where}: {error}", type(ep.env).__name__, error)

    for group in episodes:
        for ep in group:
            drop(ep, _start(ep, params, calls))
            if ep.group in dropped:
                break
    engine_calls = 0
    turn = 0
    while True:
        running = [ep for group in episodes for ep in group if ep.group not in dropped and not ep.end_reason]
        if not running:
            break
        actions, n = _sample(engine, running, turn, seed, params)
        engine_calls += n
        together = [(ep, a) for ep, a in zip(running, actions) if ep.env.concurrent_steps]
        with ThreadPoolExecutor(max(1, len(together))) as pool:
            started = {id(ep): pool.submit(_step, ep, a, params, calls) for ep, a in together}
            for ep, action in zip(running, actions):  # results in episode order, whichever finished first
                if id(ep) in started:
                    drop(ep, started[id(ep)].result())
                elif ep.group not in dropped:  # else a member that stepped earlier in this turn failed
                    drop(ep, _step(ep, action, params, calls))
        turn += 1
    kept: list[GroupRollout] = []
    for g, group in enumerate(episodes):
        if g in dropped:
            continue
        builder = builders[g]
        trajectories = [Trajectory(ep.transitions, ep.final_observation, ep.end_reason) for ep in group]
        rewards = list(builder.compute_group_rewards(trajectories))
        if len(rewards) != len(trajectories):
            raise TrinityError(
                f"{type(builder).__name__} (group {g}): compute_group_rewards gave {len(rewards)} rewards "
                f"for {len(trajectories)} trajectories"
            )
        rewards = [check_reward(r, f"{type(builder).__name__} (group {g}): a group reward") for r in rewards]
        kept.append(GroupRollout(g, builder, trajectories, rewards))
    lost = [dropped[g] for g in sorted(dropped)]
    metrics = _metrics(kept, lost, episodes, calls, engine_calls)
    return RolloutResult(kept, lost, metrics)


def _metrics(
    kept: list[GroupRollout],
    lost: list[DroppedGroup],
    episodes: list[list[_Episode]],
    calls: EnvCalls,
    engine_calls: int,
) -> dict[str, float]:
    trajectories = [t for g in kept for t in g.trajectories]
    metrics = {
        "rollout/groups": float(len(kept) + len(lost)),
        "rollout/dropped_groups": float(len(lost)),
        "rollout/episodes": float(len(trajectories)),
        "rollout/dropped_episodes": float(sum(len(episodes[d.index]) for d in lost)),
        "rollout/env_errors": float(calls.errors),
        "rollout/env_retries": float(calls.retries),
        "rollout/step_timeouts": float(calls.timeouts),
        "rollout/engine_calls": float(engine_calls),
    }
    if not trajectories:
        return metrics
    turns = [len(t.transitions) for t in trajectories]
    tokens = [len(t.transitions[-1].observation) + len(t.transitions[-1].action) for t in trajectories]
    actions = [sum(len(x.action) for x in t.transitions) for t in trajectories]
    returns = [r for g in kept for r in g.total_rewards()]
    metrics.update(
        {
            "rollout/turns/mean": statistics.fmean(turns),
            "rollout/turns/max": float(max(turns)),
            "rollout/tokens/mean": statistics.fmean(tokens),
            "rollout/tokens/max": float(max(tokens)),
            "rollout/action_tokens/mean": statistics.fmean(actions),
            "reward/mean": statistics.fmean(returns),
            "reward/std": statistics.pstdev(returns),
        }
    )
    for reason in END_REASONS:
        metrics[f"rollout/end/{reason}"] = sum(t.end_reason == reason for t in trajectories) / len(trajectories)
    declared = {name for group in episodes for ep in group for name in _declared(ep.env)}
    metrics.update(_env_metrics("env/", trajectories, declared))
    for tag in sorted({tag for g in kept for tag in g.builder.logging_tags()}):
        tagged = [g for g in kept if tag in g.builder.logging_tags()]
        metrics[f"tag/{tag}/reward/mean"] = statistics.fmean(r for g in tagged for r in g.total_rewards())
        names = {name for g in tagged for ep in episodes[g.index] for name in _declared(ep.env)}
        metrics.update(_env_metrics(f"tag/{tag}/env/", [t for g in tagged for t in g.trajectories], names))
    return metrics


def _env_metrics(prefix: str, trajectories: list[Trajectory], declared: set[str]) -> dict[str, float]:
    """Each step metric summed over its episode, then averaged over episodes (0 where an episode
    did not report it); every ``declared`` name is there, reported or not."""
    sums: list[dict[str, float]] = []
    for t in trajectories:
        total: dict[str, float] = {}
        for x in t.transitions:
            for key, value in x.metrics.items():
                total[key] = total.get(key, 0.0) + value
        sums.append(total)
    keys = sorted(declared | {k for s in sums for k in s})
    return {prefix + k: statistics.fmean(s.get(k, 0.0) for s in sums) for k in keys}


EVAL_KEYS = ("env/", "rollout/turns/")  # what a held-out evaluation logs of a rollout's metrics, under eval/


def eval_env_metrics(metrics: dict[str, float], dropped: int) -> dict[str, float]:
    """The env's own metrics of a held-out evaluation, as both front doors log them:
    ``eval/env/<name>`` and ``eval/rollout/turns/mean|max`` from the evaluation rollout's
    ``metrics``, and ``eval/dropped``, the held-out episodes dropped (they score 0 in
    ``eval/accuracy``).

    >>> eval_env_metrics({"env/correct": 0.5, "rollout/turns/mean": 2.0, "reward/mean": 0.5}, dropped=1)
    {'eval/env/correct': 0.5, 'eval/rollout/turns/mean': 2.0, 'eval/dropped': 1.0}
    """
    out = {f"eval/{k}": v for k, v in metrics.items() if k.startswith(EVAL_KEYS)}
    return {**out, "eval/dropped": float(dropped)}
