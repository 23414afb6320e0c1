"""Episodes -> :class:`~trinity_like.experience.Experience` rows the trainer reads.

One episode is one row. Its tokens are the last turn's prompt followed by the last action:
since every observation extends the previous one plus its action, that sequence holds
every turn, exactly as the sampler saw it. Layout, for a 2-turn episode::

    tokens       = obs_0 | action_0 | new obs tokens | action_1
    prompt_length= len(obs_0)
    action_mask  =       | 1 ... 1  | 0 ... 0        | 1 ... 1
    logprobs     =       | sampled  | 0.0            | sampled

Only the policy's own tokens carry loss (``action_mask`` 1); a tool's output or another
player's words are context (0). The reward is the episode's return -- its step rewards
plus its group reward -- so the advantage is broadcast over all of the episode's actions.

Example::

    rows = group_experiences(rollout_groups(builders, engine=engine, seed=0))
    rows[0].tokens, rows[0].action_mask, rows[0].reward, rows[0].info["turns"]
"""

from __future__ import annotations

from trinity_like.envs.rollout import GroupRollout, RolloutResult
from trinity_like.envs.types import Trajectory
from trinity_like.errors import TrinityError
from trinity_like.experience import Experience


def trajectory_experience(
    trajectory: Trajectory, *, reward: float, group_id: str, task_id: str = "", info: dict | None = None
) -> Experience:
    """One episode as one row; ``reward`` is its return (step rewards + group reward)."""
    steps = trajectory.transitions
    if not steps:
        raise TrinityError("trajectory_experience: the trajectory has no transitions")
    tokens = list(steps[-1].observation) + list(steps[-1].action)
    prompt_length = len(steps[0].observation)
    stalest = min(steps, key=lambda step: step.model_version)
    mask: list[int] = []
    logprobs: list[float] = []
    done = prompt_length  # tokens laid out so far
    metrics: dict[str, float] = {}
    for turn, step in enumerate(steps):
        if len(step.observation) < done or step.observation != tokens[: len(step.observation)]:
            raise TrinityError(
                f"trajectory_experience: the observation of turn {turn} does not extend the episode's tokens"
            )
        if len(step.logprobs) != len(step.action):
            raise TrinityError(
                f"trajectory_experience: turn {turn} has {len(step.logprobs)} logprobs "
                f"for {len(step.action)} action tokens"
            )
        new = len(step.observation) - done
        mask += [0] * new + [1] * len(step.action)
        logprobs += [0.0] * new + [float(x) for x in step.logprobs]
        done = len(step.observation) + len(step.action)
        for key, value in step.metrics.items():
            metrics[key] = metrics.get(key, 0.0) + value
    return Experience(
        tokens=tokens,
        prompt_length=prompt_length,
        logprobs=logprobs,
        action_mask=mask,
        reward=float(reward),
        group_id=group_id,
        task_id=task_id,
        model_version=stalest.model_version,  # the stalest turn decides
        weights_digest=stalest.weights_digest,
        finish_reason=steps[-1].finish_reason,
        info={
            "turns": len(steps),
            "end_reason": trajectory.end_reason,
            "step_rewards": [step.reward for step in steps],
            "metrics": metrics,  # step metrics summed over the episode
            **(info or {}),
        },
    )


def group_rows(group: GroupRollout, *, task_id: str = "", answer: str | None = None) -> list[Experience]:
    """The rows of one group's episodes, sharing its group id (and ``task_id``, the task the
    group played; ``answer``, when given, is kept in each row's info)."""
    tags = group.builder.logging_tags()
    rows = []
    for trajectory, group_reward, total in zip(group.trajectories, group.group_rewards, group.total_rewards()):
        info = {"group_reward": group_reward, "tags": list(tags)}
        if answer is not None:
            info["answer"] = answer
        rows.append(
            trajectory_experience(trajectory, reward=total, group_id=group.group_id, task_id=task_id, info=info)
        )
    return rows


def group_experiences(result: RolloutResult) -> list[Experience]:
    """The rows of every kept group of a rollout, group by group."""
    return [row for group in result.groups for row in group_rows(group)]
