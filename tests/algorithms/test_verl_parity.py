"""Parity with verl's ``core_algos`` (an independent implementation) on random inputs, float64.

Covers what verl implements the same way: GRPO / RLOO / REINFORCE++ / GAE advantages, the
vanilla PPO, GSPO and CISPO losses with their metrics, the critic's clipped value loss,
the KL estimators and every loss aggregation mode (with verl's global batch normalisers).
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from _lib.algo_testlib import DT, rand_batch, rand_mask

from trinity_like import ops
from trinity_like.components import build_params, call_component
from trinity_like.registry import ADVANTAGE_FN, KL_FN, POLICY_LOSS_FN

core_algos = pytest.importorskip("verl.trainer.ppo.core_algos")
ActorConfig = pytest.importorskip("verl.workers.config").ActorConfig


def run(registry, name, batch, **params):
    fn = registry.get(name)
    return call_component(fn, batch, build_params(fn, params))


def actor_config(low=0.2, high=0.28):
    return ActorConfig(
        strategy="fsdp",
        clip_ratio=0.2,
        clip_ratio_low=low,
        clip_ratio_high=high,
        ppo_micro_batch_size_per_gpu=1,
        rollout_n=1,
    )


def close(a, b, tol=1e-9):
    return torch.allclose(torch.as_tensor(a, dtype=DT), torch.as_tensor(b, dtype=DT), atol=tol, rtol=tol)


# -- aggregation ---------------------------------------------------------------------------
@pytest.mark.parametrize("mode", ops.AGG_MODES)
@pytest.mark.parametrize("seed", [0, 1])
def test_aggregation_matches_verl_agg_loss(mode, seed):
    g = torch.Generator().manual_seed(seed)
    loss = torch.randn(9, 8, generator=g, dtype=DT)
    mask = rand_mask(9, 8, g, empty_rows=2)
    assert close(ops.aggregate(loss, mask, mode), core_algos.agg_loss(loss, mask, mode), 1e-7)
    # with the global normalisers of a larger batch (verl: batch_num_tokens, global_batch_size)
    ours = ops.aggregate(loss, mask, mode, num_tokens=50, num_seqs=17, loss_scale_factor=32)
    theirs = core_algos.agg_loss(loss, mask, mode, batch_num_tokens=50, global_batch_size=17, loss_scale_factor=32)
    assert close(ours, theirs, 1e-7)


# -- advantages -------------------------------------------------------------------------------
def groups(seed):
    g = torch.Generator().manual_seed(seed)
    index = torch.tensor([3, 3, 3, 3, 8, 8, 1, 1, 1, 6, 6, 6, 6, 6])  # every group has >= 2 rows
    mask = rand_mask(index.numel(), 5, g)
    rewards = torch.randn(index.numel(), generator=g, dtype=DT)
    return rewards, index, mask


@pytest.mark.parametrize("norm_by_std", [True, False])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_grpo_matches_verl(norm_by_std, seed):
    rewards, index, mask = groups(seed)
    ours, _ = run(
        ADVANTAGE_FN, "grpo", {"rewards": rewards, "group_index": index, "action_mask": mask}, norm_by_std=norm_by_std
    )
    theirs, _ = core_algos.compute_grpo_outcome_advantage(
        ops.token_level_rewards(rewards, mask), mask, np.array(index.tolist()), norm_adv_by_std_in_grpo=norm_by_std
    )
    assert close(ours, theirs)


@pytest.mark.parametrize("seed", [0, 1])
def test_rloo_matches_verl(seed):
    rewards, index, mask = groups(seed)
    ours, _ = run(ADVANTAGE_FN, "rloo", {"rewards": rewards, "group_index": index, "action_mask": mask})
    theirs, _ = core_algos.compute_rloo_outcome_advantage(
        ops.token_level_rewards(rewards, mask), mask, np.array(index.tolist())
    )
    assert close(ours, theirs)


def holed_mask(seed, B=6, R=8):
    g = torch.Generator().manual_seed(seed)
    mask = rand_mask(B, R, g)
    mask[0, 1:3] = 0  # tool output inside a response (multi-turn)
    mask[0, 3:] = 1
    return mask, g


@pytest.mark.parametrize("seed", [0, 1])
def test_reinforce_plus_plus_matches_verl(seed):
    mask, g = holed_mask(seed)
    rewards = torch.randn(mask.shape, generator=g, dtype=DT) * mask
    ours, ours_ret = run(
        ADVANTAGE_FN, "reinforce_plus_plus", {"token_level_rewards": rewards, "action_mask": mask}, gamma=0.95
    )
    theirs, theirs_ret = core_algos.compute_reinforce_plus_plus_outcome_advantage(
        rewards, mask, config=SimpleNamespace(gamma=0.95)
    )
    assert close(ours, theirs, 1e-7) and close(ours_ret, theirs_ret)


@pytest.mark.parametrize("gamma, lam", [(1.0, 1.0), (0.99, 0.95), (0.9, 0.0)])
def test_gae_matches_verl(gamma, lam):
    mask, g = holed_mask(3)
    values = torch.randn(mask.shape, generator=g, dtype=DT)
    rewards = (
        ops.token_level_rewards(torch.randn(mask.shape[0], generator=g, dtype=DT), mask)
        - 0.01 * torch.rand(mask.shape, generator=g, dtype=DT) * mask
    )
    ours, ours_ret = run(
        ADVANTAGE_FN,
        "gae",
        {"token_level_rewards": rewards, "values": values, "action_mask": mask},
        gamma=gamma,
        lam=lam,
    )
    theirs, theirs_ret = core_algos.compute_gae_advantage_return(rewards, values, mask, gamma, lam)
    on = mask > 0  # verl leaves padding positions unmasked
    assert close(ours[on], theirs[on], 1e-7) and close(ours_ret[on], theirs_ret[on])


# -- policy losses ----------------------------------------------------------------------------
@pytest.mark.parametrize("mode", ops.AGG_MODES)
@pytest.mark.parametrize("seed", [0, 1])
def test_vanilla_ppo_matches_verl(mode, seed):
    b = rand_batch(B=8, R=6, seed=seed)
    b["logprob"] = b["old_logprob"] + 0.6 * torch.randn(8, 6, dtype=DT, generator=torch.Generator().manual_seed(seed))
    b["logprob"][1, 0], b["advantages"][1, 0] = b["old_logprob"][1, 0] + 2.0, -1.0  # ratio 7.4 > c, A < 0
    ours, m = run(
        POLICY_LOSS_FN, "ppo", b, clip_ratio_low=0.2, clip_ratio_high=0.28, clip_ratio_c=3.0, loss_agg_mode=mode
    )
    theirs, tm = core_algos.compute_policy_loss_vanilla(
        b["old_logprob"], b["logprob"], b["advantages"], b["action_mask"], loss_agg_mode=mode, config=actor_config()
    )
    assert close(ours, theirs, 1e-7)
    assert m["clip_frac"] == pytest.approx(tm["actor/pg_clipfrac"])
    assert m["clip_frac_lower"] == pytest.approx(tm["actor/pg_clipfrac_lower"])
    assert m["ppo_kl"] == pytest.approx(tm["actor/ppo_kl"])
    assert m["clip_frac_lower"] > 0  # the dual clip was exercised


@pytest.mark.parametrize("seed", [0, 1])
def test_gspo_matches_verl(seed):
    b = rand_batch(B=8, R=6, seed=seed)
    b["logprob"] = b["old_logprob"] + 1e-3 * torch.randn(8, 6, dtype=DT, generator=torch.Generator().manual_seed(seed))
    b["advantages"] = b["advantages"][:, :1].expand(-1, 6).contiguous()
    ours, m = run(POLICY_LOSS_FN, "gspo", b)
    theirs, tm = core_algos.compute_policy_loss_gspo(
        b["old_logprob"],
        b["logprob"],
        b["advantages"],
        b["action_mask"],
        loss_agg_mode="seq-mean-token-mean",
        config=actor_config(3e-4, 4e-4),
    )
    assert close(ours, theirs, 1e-7) and m["clip_frac"] == pytest.approx(tm["actor/pg_clipfrac"])
    assert 0 < m["clip_frac"] < 1


@pytest.mark.parametrize("seed", [0, 1])
def test_cispo_matches_verl_and_its_gradient(seed):
    b = rand_batch(B=8, R=6, seed=seed)
    lp = b["logprob"].clone().requires_grad_(True)
    ours, m = run(POLICY_LOSS_FN, "cispo", {**b, "logprob": lp}, clip_ratio_low=0.2, clip_ratio_high=0.28)
    lp2 = b["logprob"].clone().requires_grad_(True)
    theirs, tm = core_algos.compute_policy_loss_cispo(
        b["old_logprob"], lp2, b["advantages"], b["action_mask"], config=actor_config()
    )
    assert close(ours, theirs) and m["clip_frac"] == pytest.approx(tm["actor/pg_clipfrac"])
    (g1,), (g2,) = torch.autograd.grad(ours, lp), torch.autograd.grad(theirs, lp2)
    assert close(g1, g2)


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-sum"])
def test_value_clip_matches_verl(mode):
    b = rand_batch(B=7, R=5, seed=4)
    ours, m = run(POLICY_LOSS_FN, "value_clip", b, cliprange_value=0.2, loss_agg_mode=mode)
    theirs, clipfrac = core_algos.compute_value_loss(
        b["values"], b["returns"], b["old_values"], b["action_mask"], 0.2, loss_agg_mode=mode
    )
    assert close(ours, theirs, 1e-7) and m["vf_clipfrac"] == pytest.approx(clipfrac.item())


# -- KL ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["k1", "k2", "k3", "low_var_kl", "abs"])
def test_kl_estimators_match_verl(name):
    g = torch.Generator().manual_seed(0)
    logprob = -torch.rand(6, 9, generator=g, dtype=DT) * 4
    ref = logprob + torch.randn(6, 9, generator=g, dtype=DT) * 2
    ref[0, 0] = logprob[0, 0] + 30.0  # exercises verl's clamps
    assert close(KL_FN.get(name)(logprob=logprob, ref_logprob=ref), core_algos.kl_penalty(logprob, ref, name), 1e-12)
