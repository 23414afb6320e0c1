"""The client loop's advantages come from the ADVANTAGE_FN registry, by name: the datums' advantages
against hand computations (RLOO, GRPO, per turn, two groups), a registered custom estimator used
by the loop end to end, and one-line errors for what the loop cannot run."""

from __future__ import annotations

import doctest
import statistics

import pytest
import torch

import cookbook.rl.advantages
import trinity_like.client as tinker
from cookbook.rl.train import Episode, RLTrainConfig, build_rows, train
from trinity_like.envs.dataset import build_env_factory
from trinity_like.errors import ConfigError
from trinity_like.explorer.tasks import ArithmeticParams, arithmetic_tasks
from trinity_like.registry import ADVANTAGE_FN

NO_SPACE = {"reward_fn": "format", "reward_params": {"pattern": r"\S+"}, "max_tokens": 8}  # varies on a random model
CALLS: list[tuple[list[float], list[int]]] = []


@ADVANTAGE_FN.register_module("test_best_of_group", force=True)
def best_of_group(
    *, rewards: torch.Tensor, action_mask: torch.Tensor, group_index: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Test estimator: 1 for the rows holding their group's best reward, -1 for the others."""
    CALLS.append((rewards.tolist(), group_index.tolist()))
    best = {int(g): max(float(r) for r, h in zip(rewards, group_index) if h == g) for g in group_index}
    adv_B = torch.tensor([1.0 if float(r) == best[int(g)] else -1.0 for r, g in zip(rewards, group_index)])
    adv_BR = adv_B.to(rewards.dtype).unsqueeze(-1) * (action_mask > 0)
    return adv_BR, adv_BR


def config(tmp_path, **overrides):
    values = {"log_path": str(tmp_path / "run"), "skip_zero_advantage_groups": False, "progress": False}
    return RLTrainConfig(**{**values, **overrides})


def episode(rewards: list[float]) -> Episode:
    """An episode of len(rewards) turns: 2 observation tokens, then a 2-token action per turn."""
    tokens, spans = [1, 2], []
    for t in range(len(rewards)):
        spans.append((len(tokens), len(tokens) + 2))
        tokens += [10 + t, 20 + t] + ([5] if t < len(rewards) - 1 else [])  # the env's reply between turns
    return Episode(tokens, [0.0] * len(tokens), spans, list(rewards))


def turn_values(row, ep: Episode) -> list[float]:
    """The advantage each turn's tokens carry in the datum (position p predicts token p + 1)."""
    adv = row.datum.loss_fn_inputs["advantages"].to_numpy()
    values = []
    for start, end in ep.spans:
        span = adv[start - 1 : end - 1]
        assert (span == span[0]).all()  # one value on the whole action
        values.append(float(span[0]))
    return values


def same(got: list[list[float]], want: list[list[float]], tol: float = 1e-6) -> bool:
    """Equal shapes and values within ``tol``."""
    return [len(g) for g in got] == [len(w) for w in want] and all(
        abs(a - b) <= tol for g, w in zip(got, want) for a, b in zip(g, w)
    )


def test_docstring_examples():
    assert doctest.testmod(cookbook.rl.advantages).failed == 0


def test_the_default_is_group_centered_and_matches_a_hand_computation(tmp_path):
    rewards = [1.0, 0.0, 0.0, 0.5]
    eps = [episode([r]) for r in rewards]
    assert config(tmp_path).advantage == "group_centered"
    rows, _ = build_rows([eps], config(tmp_path))
    mean = sum(rewards) / 4
    assert same([turn_values(r, e) for r, e in zip(rows, eps)], [[r - mean] for r in rewards], 1e-7)


def test_rloo_and_grpo_by_name_match_hand_computations_group_by_group(tmp_path):
    groups = [[1.0, 0.0, 0.0, 0.5], [2.0, 3.0, 7.0]]  # two groups: each has its own baseline
    eps = [[episode([r]) for r in g] for g in groups]
    rloo, _ = build_rows(eps, config(tmp_path, advantage="rloo"))
    want = [[r - (sum(g) - r) / (len(g) - 1)] for g in groups for r in g]  # minus the mean of the others
    got = [turn_values(row, ep) for row, ep in zip(rloo, [e for g in eps for e in g])]
    assert same(got, want, 1e-6)
    grpo, _ = build_rows(eps, config(tmp_path, advantage="grpo"))
    want = [[(r - statistics.fmean(g)) / (statistics.stdev(g) + 1e-6)] for g in groups for r in g]
    got = [turn_values(row, ep) for row, ep in zip(grpo, [e for g in eps for e in g])]
    assert same(got, want, 1e-5)
    dr_grpo, _ = build_rows(eps, config(tmp_path, advantage="grpo", advantage_params={"norm_by_std": False}))
    want = [[r - statistics.fmean(g)] for g in groups for r in g]
    assert same([turn_values(row, ep) for row, ep in zip(dr_grpo, [e for g in eps for e in g])], want)


def test_per_turn_rloo_compares_each_turns_returns_to_go(tmp_path):
    rewards = [[1.0, 0.0, 2.0], [0.0, 0.0, 0.0], [0.0, 3.0]]
    eps = [episode(r) for r in rewards]
    rows, _ = build_rows([eps], config(tmp_path, advantage="rloo", advantage_per_turn=True))
    # By hand: returns-to-go (3, 2, 2), (0, 0, 0), (3, 3, 0: ended before turn 2, counts as 0);
    # each turn's advantage: G_it minus the mean of the other episodes' G_jt.
    to_go = [[3.0, 2.0, 2.0], [0.0, 0.0, 0.0], [3.0, 3.0, 0.0]]
    want = [
        [to_go[i][t] - sum(to_go[j][t] for j in range(3) if j != i) / 2 for t in range(len(r))]
        for i, r in enumerate(rewards)
    ]
    assert same([turn_values(row, ep) for row, ep in zip(rows, eps)], want, 1e-6)
    # the same episodes per episode: every turn gets the episode's own leave-one-out advantage (returns 3, 0, 3)
    rows, _ = build_rows([eps], config(tmp_path, advantage="rloo"))
    assert same([turn_values(row, ep) for row, ep in zip(rows, eps)], [[1.5] * 3, [-3.0] * 3, [1.5] * 2])


def test_equal_rewards_give_exact_zeros_and_are_skipped(tmp_path):
    same = [episode([0.1]) for _ in range(3)]  # 0.1 * 3 / 3 is not 0.1 in floating point
    varied = [episode([r]) for r in (0.0, 1.0, 1.0)]
    for name in ("group_centered", "grpo", "rloo"):
        rows, metrics = build_rows([same, varied], config(tmp_path, advantage=name, skip_zero_advantage_groups=True))
        assert metrics["train/skipped_groups"] == 1 and len(rows) == 3, name


def test_a_registered_estimator_is_what_the_loop_uses(tmp_path):
    eps = [episode([r]) for r in (0.2, 0.9, 0.9, 0.1)]
    CALLS.clear()
    rows, _ = build_rows([eps], config(tmp_path, advantage="test_best_of_group"))
    assert [turn_values(row, ep) for row, ep in zip(rows, eps)] == [[-1.0], [1.0], [1.0], [-1.0]]
    assert CALLS == [([0.2, 0.9, 0.9, 0.1], [0, 0, 0, 0])]
    with tinker.ServiceClient(log_dir=tmp_path / "client") as service:  # and the whole loop, end to end
        training = service.create_lora_training_client("tiny-random", rank=0, seed=0)
        factory = build_env_factory("arithmetic", NO_SPACE, tokenizer=training.get_tokenizer())
        CALLS.clear()
        run = config(
            tmp_path,
            advantage="test_best_of_group",
            iterations=1,
            batch_size=2,
            group_size=4,
            eval_every=0,
            save_every=0,
        )
        result = train(run, training, factory, arithmetic_tasks(ArithmeticParams(), "train", 2))
    assert len(CALLS) == 1 and sorted(CALLS[0][1]) == [0, 0, 0, 0, 1, 1, 1, 1]  # one call, both groups of 4
    assert result.metrics[-1]["train/advantage_abs_mean"] == 1.0  # every datum carries +-1


def test_what_the_loop_cannot_run_is_a_one_line_config_error(tmp_path):
    with pytest.raises(
        ConfigError, match=r"^RLTrainConfig.advantage: unknown advantage function 'rlo'; did you mean 'rloo'"
    ):
        config(tmp_path, advantage="rlo")
    with pytest.raises(
        ConfigError, match=r"^RLTrainConfig.advantage: advantage fn 'gae' needs values, which the client"
    ):
        config(tmp_path, advantage="gae")
    with pytest.raises(
        ConfigError, match=r"^RLTrainConfig.advantage_params.norm_by_sd: unknown parameter .*'norm_by_std'"
    ):
        config(tmp_path, advantage="grpo", advantage_params={"norm_by_sd": False})
    with pytest.raises(ConfigError, match=r"^RLTrainConfig.advantage_params: rloo_advantage takes no parameters"):
        config(tmp_path, advantage="rloo", advantage_params={"epsilon": 1.0})
    with pytest.raises(ConfigError, match=r"^RLTrainConfig.advantage_params: must be a mapping, got 3"):
        config(tmp_path, advantage_params=3)
