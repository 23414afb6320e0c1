"""Advantage fns: vectorised code against naive per-group / per-token loops, and degenerate cases."""

from __future__ import annotations

import math

import pytest
import torch
from _lib.algo_testlib import DT, rand_mask

from trinity_like import ops
from trinity_like.components import build_params, call_component
from trinity_like.registry import ADVANTAGE_FN, KL_FN


def run(name, batch, **params):
    fn = ADVANTAGE_FN.get(name)
    return call_component(fn, batch, build_params(fn, params))


def group_batch(seed=0):
    g = torch.Generator().manual_seed(seed)
    index = torch.tensor([5, 5, 5, 5, 9, 2, 2, 2, 40, 40, 5, 9, 77])  # sizes 5, 2, 3, 2, 1; not contiguous
    B = index.numel()
    rewards = torch.randn(B, generator=g, dtype=DT)
    rewards[8] = rewards[9]  # a group whose rewards are all equal
    return {"rewards": rewards, "group_index": index, "action_mask": rand_mask(B, 6, g)}


def naive_group_advantage(rewards, index, kind, eps=1e-6):
    """Per-row advantage computed one group at a time with plain Python floats."""
    r, idx = rewards.tolist(), index.tolist()
    out = []
    for i in range(len(r)):
        group = [r[j] for j in range(len(r)) if idx[j] == idx[i]]
        n = len(group)
        if n == 1:
            out.append(0.0)
            continue
        mean = sum(group) / n
        others = (sum(group) - r[i]) / (n - 1)
        std = math.sqrt(sum((x - mean) ** 2 for x in group) / (n - 1))
        out.append(
            {
                "grpo": (r[i] - mean) / (std + eps),
                "dr_grpo": r[i] - mean,
                "group_centered": r[i] - mean,
                "rloo": r[i] - others,
            }[kind]
        )
    return torch.tensor(out, dtype=DT)


@pytest.mark.parametrize(
    "name, params, kind",
    [
        ("grpo", {}, "grpo"),
        ("grpo", {"norm_by_std": False}, "dr_grpo"),
        ("group_centered", {}, "group_centered"),
        ("rloo", {}, "rloo"),
    ],
)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_group_advantages_match_a_naive_per_group_loop(name, params, kind, seed):
    b = group_batch(seed)
    adv, ret = run(name, b, **params)
    expected = naive_group_advantage(b["rewards"], b["group_index"], kind).unsqueeze(-1) * b["action_mask"]
    assert torch.allclose(adv, expected, atol=1e-12)
    assert torch.equal(adv, ret)
    assert (adv[b["action_mask"] == 0] == 0).all()


@pytest.mark.parametrize("name", ["grpo", "group_centered", "rloo"])
def test_a_group_of_one_has_zero_advantage(name):
    b = {
        "rewards": torch.tensor([3.0, -1.0], dtype=DT),
        "group_index": torch.tensor([0, 1]),
        "action_mask": torch.ones(2, 3, dtype=DT),
    }
    adv, _ = run(name, b)
    assert (adv == 0).all()


def test_equal_rewards_give_zero_grpo_advantage():
    b = {
        "rewards": torch.full((4,), 0.7, dtype=DT),
        "group_index": torch.zeros(4, dtype=torch.long),
        "action_mask": torch.ones(4, 2, dtype=DT),
    }
    assert (run("grpo", b)[0] == 0).all()


def naive_discounted_whitened(rewards, mask, gamma):
    B, R = len(rewards), len(rewards[0])
    returns = [[0.0] * R for _ in range(B)]
    for i in range(B):
        running = 0.0
        for t in reversed(range(R)):
            if mask[i][t]:
                running = rewards[i][t] + gamma * running
                returns[i][t] = running
    vals = [returns[i][t] for i in range(B) for t in range(R) if mask[i][t]]
    mean = sum(vals) / len(vals)
    std = math.sqrt(sum((v - mean) ** 2 for v in vals) / (len(vals) - 1))
    adv = [
        [(returns[i][t] - mean) / math.sqrt(std**2 + 1e-8) if mask[i][t] else 0.0 for t in range(R)] for i in range(B)
    ]
    return torch.tensor(adv, dtype=DT), torch.tensor(returns, dtype=DT)


def test_reinforce_plus_plus_matches_a_naive_loop():
    g = torch.Generator().manual_seed(0)
    mask = rand_mask(5, 6, g)
    mask[2, 1] = 0  # a hole (tool output inside a response)
    rewards = torch.randn(5, 6, generator=g, dtype=DT) * mask
    adv, ret = run("reinforce_plus_plus", {"token_level_rewards": rewards, "action_mask": mask}, gamma=0.9)
    exp_adv, exp_ret = naive_discounted_whitened(rewards.tolist(), mask.tolist(), 0.9)
    assert torch.allclose(adv, exp_adv, atol=1e-10) and torch.allclose(ret, exp_ret, atol=1e-12)


def naive_gae(rewards, values, mask, gamma, lam):
    """GAE one row at a time over the trained tokens only (masked tokens are skipped)."""
    B, R = len(rewards), len(rewards[0])
    adv = [[0.0] * R for _ in range(B)]
    for i in range(B):
        steps = [t for t in range(R) if mask[i][t]]
        later = 0.0
        for k in reversed(range(len(steps))):
            t = steps[k]
            next_value = values[i][steps[k + 1]] if k + 1 < len(steps) else 0.0
            delta = rewards[i][t] + gamma * next_value - values[i][t]
            later = delta + gamma * lam * later
            adv[i][t] = later
    return adv


def test_gae_matches_a_naive_loop_and_returns_are_advantage_plus_value():
    g = torch.Generator().manual_seed(1)
    mask = rand_mask(4, 7, g)
    values = torch.randn(4, 7, generator=g, dtype=DT)
    rewards = ops.token_level_rewards(torch.randn(4, generator=g, dtype=DT), mask)
    raw, ret = run(
        "gae",
        {"token_level_rewards": rewards, "values": values, "action_mask": mask},
        gamma=0.99,
        lam=0.9,
        whiten=False,
    )
    expected = torch.tensor(naive_gae(rewards.tolist(), values.tolist(), mask.tolist(), 0.99, 0.9), dtype=DT)
    assert torch.allclose(raw, expected, atol=1e-12)
    assert torch.allclose(ret, (expected + values) * mask, atol=1e-12)
    white, _ = run("gae", {"token_level_rewards": rewards, "values": values, "action_mask": mask})
    on = mask > 0
    assert ops.masked_mean(white, mask).item() == pytest.approx(0.0, abs=1e-12)
    assert white[on].std().item() == pytest.approx(1.0, abs=1e-6)


def test_gae_with_lambda_one_and_no_discount_is_return_minus_value():
    mask = torch.tensor([[1, 1, 1, 0]], dtype=DT)
    values = torch.tensor([[0.5, -0.2, 0.1, 7.0]], dtype=DT)
    rewards = torch.tensor([[0.0, 0.0, 1.0, 0.0]], dtype=DT)
    adv, ret = run(
        "gae", {"token_level_rewards": rewards, "values": values, "action_mask": mask}, gamma=1.0, lam=1.0, whiten=False
    )
    assert adv[0].tolist() == pytest.approx([1 - 0.5, 1 + 0.2, 1 - 0.1, 0.0])  # A_t = G_t - V_t
    assert ret[0].tolist() == pytest.approx([1.0, 1.0, 1.0, 0.0])


def test_kl_shaping_with_coefficient_zero_leaves_advantages_unchanged():
    g = torch.Generator().manual_seed(2)
    mask = rand_mask(4, 5, g)
    rewards = ops.token_level_rewards(torch.randn(4, generator=g, dtype=DT), mask)
    kl = KL_FN.get("k1")(logprob=torch.randn(4, 5, dtype=DT), ref_logprob=torch.randn(4, 5, dtype=DT))
    batch = {"token_level_rewards": rewards, "action_mask": mask, "values": torch.randn(4, 5, dtype=DT)}
    for name in ("gae", "reinforce_plus_plus"):
        shaped, _ = ops.apply_kl_penalty(rewards, kl, mask, coef=0.0)
        assert torch.equal(run(name, {**batch, "token_level_rewards": shaped})[0], run(name, batch)[0])
        shaped, _ = ops.apply_kl_penalty(rewards, kl, mask, coef=0.1)
        assert not torch.equal(run(name, {**batch, "token_level_rewards": shaped})[0], run(name, batch)[0])
