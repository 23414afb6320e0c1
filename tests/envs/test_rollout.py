"""Rollouts on a tiny real model through the RolloutEngine: tokens, masks, seeds, limits, failures."""

from __future__ import annotations

import time

import pytest

from trinity_like.envs.experience import group_experiences
from trinity_like.envs.rollout import RolloutParams, episode_seed, rollout_groups
from trinity_like.envs.types import Env, EnvGroupBuilder, StepResult, StopCondition
from trinity_like.errors import TrinityError
from trinity_like.models.chat import message_tokens, render_prompt


class Recorder:
    """The engine, recording every request and what it sampled for it."""

    def __init__(self, engine):
        self.engine = engine
        self.calls = []  # [(requests, sampling, samples)]

    def run(self, requests, sampling):
        out = self.engine.run(requests, sampling)
        self.calls.append((requests, sampling, out))
        return out

    def seen(self, seed):
        """(prompt, sampled tokens, logprobs) of the sample drawn with ``seed``."""
        found = [
            (list(req.prompt_ids), s.token_ids, s.logprobs)
            for requests, _, out in self.calls
            for req, group in zip(requests, out)
            for want, s in zip(req.seeds, group)
            if want == seed
        ]
        assert len(found) == 1
        return found[0]


class ChatTurns(Env):
    """A chat that answers every action with the user message 'more', until ``turns`` actions."""

    def __init__(self, tok, turns=3, max_tokens=6, stop_token_ids=None, reward=0.5):
        self.tok, self.turns, self.reward = tok, turns, reward
        self.stop = StopCondition(max_tokens=max_tokens, stop_token_ids=stop_token_ids)
        self.messages = [{"role": "user", "content": "Count with me."}]
        self.history = render_prompt(tok, self.messages)
        self.done = 0

    def initial_observation(self):
        return list(self.history), self.stop

    def step(self, action):
        self.done += 1
        if self.done == self.turns:
            return StepResult(self.reward, True, metrics={"steps": 1.0, "finished": 1.0})
        reply = {"role": "user", "content": "more"}
        self.history += list(action) + message_tokens(self.tok, self.messages, [reply], action_tokens=action)
        self.messages += [{"role": "assistant", "content": self.tok.decode(action)}, reply]
        return StepResult(self.reward, False, list(self.history), self.stop, {"steps": 1.0})


class Group(EnvGroupBuilder):
    def __init__(self, make, size=2, group_rewards=None, tags=()):
        self.make, self.size, self.rewards, self.tags = make, size, group_rewards, list(tags)

    def make_envs(self):
        return [self.make() for _ in range(self.size)]

    def compute_group_rewards(self, trajectories):
        return list(self.rewards) if self.rewards is not None else super().compute_group_rewards(trajectories)

    def logging_tags(self):
        return self.tags


def test_three_turn_training_tokens_are_the_sampled_tokens_byte_for_byte(engine, tok):
    rec = Recorder(engine)
    result = rollout_groups([Group(lambda: ChatTurns(tok), size=2)], engine=rec, seed=7)
    assert not result.dropped and len(rec.calls) == 3  # one engine call per turn
    rows = group_experiences(result)
    for member, (row, traj) in enumerate(zip(rows, result.groups[0].trajectories)):
        assert row.info["turns"] == 3 and traj.end_reason == "done"
        seen = [rec.seen(episode_seed(7, 0, member, turn)) for turn in range(3)]
        last_prompt, last_action, _ = seen[-1]
        assert row.tokens == last_prompt + last_action  # exactly what the sampler saw
        assert row.prompt_length == len(seen[0][0])
        expected_mask = [0] * len(row.tokens)
        expected_logprobs = [0.0] * len(row.tokens)
        for turn, (prompt, action, logprobs) in enumerate(seen):
            assert row.tokens[: len(prompt)] == prompt  # every turn's prompt is a prefix of the row
            if turn:
                before, before_action, _ = seen[turn - 1]
                assert prompt[: len(before) + len(before_action)] == before + before_action
            expected_mask[len(prompt) : len(prompt) + len(action)] = [1] * len(action)
            expected_logprobs[len(prompt) : len(prompt) + len(action)] = logprobs
        assert row.action_mask == expected_mask[row.prompt_length :]
        assert row.logprobs == expected_logprobs[row.prompt_length :]
        assert sum(row.action_mask) == sum(len(a) for _, a, _ in seen)
        # The observation tokens are the chat template's framing of 'more', unmasked nowhere.
        text = tok.decode([t for t, m in zip(row.response_tokens, row.action_mask) if m == 0])
        assert text.count("<|im_start|>user\nmore<|im_end|>") == 2
        assert row.reward == pytest.approx(1.5) and row.info["step_rewards"] == [0.5, 0.5, 0.5]
        assert row.info["metrics"] == {"steps": 3.0, "finished": 1.0}
    assert rows[0].group_id == rows[1].group_id
    assert result.metrics["rollout/turns/mean"] == 3 and result.metrics["env/steps"] == 3
    assert result.metrics["env/finished"] == 1.0 and result.metrics["rollout/end/done"] == 1.0


def test_seeds_are_per_episode_and_turn(engine, tok):
    """An episode samples the same actions whatever else runs beside it."""

    def actions(result, group):
        return [[t.action for t in traj.transitions] for traj in result.groups[group].trajectories]

    alone = rollout_groups([Group(lambda: ChatTurns(tok))], engine=engine, seed=3)
    again = rollout_groups([Group(lambda: ChatTurns(tok))], engine=engine, seed=3)
    crowded = rollout_groups(
        [Group(lambda: ChatTurns(tok)), Group(lambda: ChatTurns(tok, turns=1), size=5)], engine=engine, seed=3
    )
    other = rollout_groups([Group(lambda: ChatTurns(tok))], engine=engine, seed=4)
    assert actions(alone, 0) == actions(again, 0) == actions(crowded, 0)
    assert actions(alone, 0) != actions(other, 0)
    assert actions(alone, 0)[0] != actions(alone, 0)[1]  # group members draw differently


def test_group_rewards_are_added_and_tags_reported(engine, tok):
    builder = Group(lambda: ChatTurns(tok, turns=1, reward=1.0), group_rewards=[0.5, -2.0], tags=["a"])
    result = rollout_groups([builder], engine=engine, seed=0)
    rows = group_experiences(result)
    assert [r.reward for r in rows] == [1.5, -1.0]
    assert rows[0].info["group_reward"] == 0.5 and rows[0].info["tags"] == ["a"]
    assert result.metrics["tag/a/reward/mean"] == pytest.approx(0.25)
    bad = Group(lambda: ChatTurns(tok, turns=1), group_rewards=[1.0])
    with pytest.raises(TrinityError, match=r"Group \(group 0\): compute_group_rewards gave 1 rewards for 2"):
        rollout_groups([bad], engine=engine, seed=0)


def test_max_turns_ends_the_episode_cleanly(engine, tok):
    result = rollout_groups(
        [Group(lambda: ChatTurns(tok, turns=100))], engine=engine, seed=0, params=RolloutParams(max_turns=2)
    )
    for traj in result.groups[0].trajectories:
        assert len(traj.transitions) == 2 and traj.end_reason == "max_turns"
        assert not traj.transitions[-1].episode_done
    assert result.metrics["rollout/end/max_turns"] == 1.0


def test_max_total_tokens_cuts_the_last_action_and_ends_the_episode(engine, tok):
    start = len(ChatTurns(tok).history)
    limit = start + 6 + 3  # room for one 6-token action, its observation overflows; or cut
    result = rollout_groups(
        [Group(lambda: ChatTurns(tok, turns=100, stop_token_ids=()))],
        engine=engine,
        seed=0,
        params=RolloutParams(max_total_tokens=limit),
    )
    for row, traj in zip(group_experiences(result), result.groups[0].trajectories):
        assert traj.end_reason == "context" and len(row.tokens) <= limit
    # An action longer than the room left is cut to it, and finishes with "length".
    result = rollout_groups(
        [Group(lambda: ChatTurns(tok, turns=100, stop_token_ids=()))],
        engine=engine,
        seed=0,
        params=RolloutParams(max_total_tokens=start + 4),
    )
    for traj in result.groups[0].trajectories:
        assert [len(t.action) for t in traj.transitions] == [4] and traj.transitions[0].finish_reason == "length"
        assert traj.end_reason == "context"
    # The cut action is the first 4 tokens of what a 6-token cap samples (same seed).
    full = rollout_groups([Group(lambda: ChatTurns(tok, turns=1, stop_token_ids=()))], engine=engine, seed=0)
    first_action = [g.trajectories[0].transitions[0].action for g in (result.groups[0], full.groups[0])]
    assert first_action[0] == first_action[1][:4] and len(first_action[1]) == 6
    # An initial observation with no room left drops the group, counted.
    result = rollout_groups(
        [Group(lambda: ChatTurns(tok))], engine=engine, seed=0, params=RolloutParams(max_total_tokens=start)
    )
    assert not result.groups and "no room under max_total_tokens" in result.dropped[0].reason


class Flaky(ChatTurns):
    """Raises on its first ``failures`` steps."""

    def __init__(self, tok, failures):
        super().__init__(tok, turns=2)
        self.failures = failures

    def step(self, action):
        if self.failures:
            self.failures -= 1
            raise ValueError("tool server unreachable")
        return super().step(action)


class Slow(ChatTurns):
    def step(self, action):
        time.sleep(20)  # in a daemon thread the rollout stops waiting for
        return super().step(action)


def test_a_crashing_step_is_retried(engine, tok):
    result = rollout_groups(
        [Group(lambda: Flaky(tok, failures=1))], engine=engine, seed=0, params=RolloutParams(step_retries=1)
    )
    assert not result.dropped and len(result.groups[0].trajectories[0].transitions) == 2
    assert result.metrics["rollout/env_errors"] == 2 and result.metrics["rollout/env_retries"] == 2


def test_a_step_that_keeps_crashing_drops_its_group_and_is_counted(engine, tok):
    builders = [
        Group(lambda: ChatTurns(tok)),
        Group(lambda: Flaky(tok, failures=10), size=3),
        Group(lambda: ChatTurns(tok)),
    ]
    result = rollout_groups(builders, engine=engine, seed=0, params=RolloutParams(step_retries=2))
    assert [g.index for g in result.groups] == [0, 2]
    (dropped,) = result.dropped
    assert dropped.index == 1
    assert dropped.reason == "Flaky (group 1, env 0) step at turn 0: ValueError: tool server unreachable"
    assert result.metrics["rollout/dropped_groups"] == 1 and result.metrics["rollout/dropped_episodes"] == 3
    assert result.metrics["rollout/env_errors"] == 3  # 1 + 2 retries, then the group is given up
    assert result.metrics["rollout/episodes"] == 4 and len(group_experiences(result)) == 4


def test_a_step_past_its_time_limit_drops_its_group(engine, tok):
    t0 = time.perf_counter()
    result = rollout_groups(
        [Group(lambda: Slow(tok), size=1), Group(lambda: ChatTurns(tok))],
        engine=engine,
        seed=0,
        params=RolloutParams(step_timeout_s=0.2),
    )
    assert time.perf_counter() - t0 < 15  # the rollout did not wait for the step
    assert [g.index for g in result.groups] == [1]
    assert result.dropped[0].reason == "Slow (group 0, env 0) step at turn 0: timeout after 0.2 s"
    assert result.metrics["rollout/step_timeouts"] == 1


class Rerendering(ChatTurns):
    """Re-renders the conversation each turn instead of appending: the drift the API forbids."""

    def step(self, action):
        self.messages += [{"role": "assistant", "content": "x"}, {"role": "user", "content": "more"}]
        return StepResult(0.0, False, render_prompt(self.tok, self.messages), self.stop)


class Broken(ChatTurns):
    def __init__(self, tok, result):
        super().__init__(tok)
        self.result = result

    def step(self, action):
        return self.result(self, action)


@pytest.mark.parametrize(
    "env, message",
    [
        (
            lambda tok: Rerendering(tok),
            r"^Rerendering \(group 0, env 0\): the observation after turn 0 does not extend",
        ),
        (lambda tok: Broken(tok, lambda e, a: {"reward": 1}), r"step\(\) must return a StepResult, got dict"),
        (
            lambda tok: Broken(tok, lambda e, a: StepResult(float("nan"), True)),
            r"the reward at turn 0 must be a finite",
        ),
        (
            lambda tok: Broken(tok, lambda e, a: StepResult(1.0, True, metrics={"m": "x"})),
            r"metric 'm' must be a finite",
        ),
        (lambda tok: Broken(tok, lambda e, a: StepResult(1.0, False, e.history + a, None)), "must be a StopCondition"),
        (
            lambda tok: Broken(tok, lambda e, a: (_ for _ in ()).throw(TrinityError("bad tool config"))),
            "bad tool config",
        ),
    ],
)
def test_a_broken_contract_stops_with_a_one_line_error(engine, tok, env, message):
    with pytest.raises(TrinityError, match=message) as info:
        rollout_groups([Group(lambda: env(tok), size=1)], engine=engine, seed=0)
    assert "\n" not in str(info.value)


def test_bad_params_and_builders(engine, tok):
    with pytest.raises(TrinityError, match="max_turns must be >= 1"):
        RolloutParams(max_turns=0)
    with pytest.raises(TrinityError, match="temperature must be > 0"):
        RolloutParams(temperature=0.0)
    with pytest.raises(TrinityError, match="builder 0 is a list, not an EnvGroupBuilder"):
        rollout_groups([[ChatTurns(tok)]], engine=engine, seed=0)
    with pytest.raises(TrinityError, match=r"Group \(group 0\): make_envs\(\) must return a non-empty list of Env"):
        rollout_groups([Group(lambda: ChatTurns(tok), size=0)], engine=engine, seed=0)


class RaisesTimeout(ChatTurns):
    def step(self, action):
        raise TimeoutError("the tool server did not answer")


def test_a_timeout_the_env_raises_itself_is_a_crash_and_retried(engine, tok):
    result = rollout_groups(
        [Group(lambda: RaisesTimeout(tok), size=1)], engine=engine, seed=0, params=RolloutParams(step_retries=2)
    )
    assert result.dropped[0].reason.endswith("TimeoutError: the tool server did not answer")
    assert result.metrics["rollout/env_errors"] == 3 and result.metrics["rollout/step_timeouts"] == 0


class Meeting(ChatTurns):
    """Every step waits at a barrier for the steps of all ``parties`` episodes of the turn:
    it finishes only if they run at the same time (``concurrent_steps``)."""

    concurrent_steps = True

    def __init__(self, tok, barrier, wait_s=10.0):
        super().__init__(tok, turns=2)
        self.barrier, self.wait_s = barrier, wait_s

    def step(self, action):
        self.barrier.wait(timeout=self.wait_s)
        return super().step(action)


class OneAtATime(Meeting):
    concurrent_steps = False


def test_envs_that_declare_concurrent_steps_step_together_and_results_keep_episode_order(engine, tok):
    import threading

    barrier = threading.Barrier(6)
    builders = [Group(lambda: Meeting(tok, barrier), size=3), Group(lambda: Meeting(tok, barrier), size=3)]
    result = rollout_groups(builders, engine=engine, seed=0, params=RolloutParams(step_timeout_s=30))
    assert not result.dropped and result.metrics["rollout/env_errors"] == 0
    assert [len(t.transitions) for g in result.groups for t in g.trajectories] == [2] * 6
    sequential = rollout_groups([Group(lambda: ChatTurns(tok, turns=2), size=3)] * 2, engine=engine, seed=0)
    assert [[t.transitions[-1].action for t in g.trajectories] for g in result.groups] == [
        [t.transitions[-1].action for t in g.trajectories] for g in sequential.groups
    ]  # same episodes, same order
    # the oracle: stepped one at a time, the same envs never fill the barrier, and their groups are dropped
    barrier = threading.Barrier(6)
    alone = rollout_groups(
        [Group(lambda: OneAtATime(tok, barrier, wait_s=0.1), size=3)] * 2,
        engine=engine,
        seed=0,
        params=RolloutParams(step_retries=0),
    )
    assert not alone.groups and "BrokenBarrierError" in alone.dropped[0].reason
