"""The composed objective: on-policy shortcut, KL term, entropy, pickling, input wiring."""

from __future__ import annotations

import pickle

import torch

from trinity_like.components import build_params
from trinity_like.ops import masked_mean
from trinity_like.registry import ENTROPY_LOSS_FN, POLICY_LOSS_FN
from trinity_like.trainer.objective import ComponentSpec, Objective


def batch_and_outputs(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    B, R = 4, 5
    logprob = (-torch.rand(B, R, generator=g, dtype=torch.float64)).requires_grad_()
    mask = torch.ones(B, R, dtype=torch.float64)
    mask[1, 3:] = 0
    batch = {
        "response_mask": mask,
        "advantages": torch.randn(B, R, generator=g, dtype=torch.float64),
        "ref_logprob": -torch.rand(B, R, generator=g, dtype=torch.float64),
        "num_tokens": (mask > 0).sum(),
        "num_seqs": torch.tensor(B),
    }
    return batch, {"logprob": logprob, "entropy": torch.rand(B, R, generator=g, dtype=torch.float64)}


def spec(registry, name, coef=None, **params):
    fn = registry.get(name)
    return ComponentSpec(registry.name, name, build_params(fn, params), coef)


def test_one_update_equals_explicit_old_logprob():
    batch, out = batch_and_outputs()
    obj = Objective(policy_loss=spec(POLICY_LOSS_FN, "ppo"), one_update=True)
    loss_a, _ = obj(out, batch)
    (grad_a,) = torch.autograd.grad(loss_a, out["logprob"])
    explicit = Objective(policy_loss=spec(POLICY_LOSS_FN, "ppo"))
    loss_b, _ = explicit(out, {**batch, "old_logprob": out["logprob"].detach().clone()})
    (grad_b,) = torch.autograd.grad(loss_b, out["logprob"])
    assert torch.allclose(loss_a, loss_b) and torch.allclose(grad_a, grad_b)
    # ratio 1: the gradient is the REINFORCE gradient -A * mask / num_tokens (token-mean)
    expected = -batch["advantages"] * batch["response_mask"] / batch["num_tokens"]
    assert torch.allclose(grad_a, expected)


def test_kl_term_adds_coef_times_mean_k3():
    batch, out = batch_and_outputs(1)
    base = Objective(policy_loss=spec(POLICY_LOSS_FN, "ppo"), one_update=True)
    kl = Objective(
        policy_loss=spec(POLICY_LOSS_FN, "ppo"), kl_loss=ComponentSpec("KL_FN", "k3", None, 0.5), one_update=True
    )
    l0, _ = base(out, batch)
    l1, metrics = kl(out, batch)
    x = batch["ref_logprob"] - out["logprob"].detach()
    k3 = torch.exp(x) - x - 1
    assert torch.allclose(l1 - l0, 0.5 * masked_mean(k3, batch["response_mask"]), atol=1e-12)
    assert abs(metrics["kl"] - float(masked_mean(k3, batch["response_mask"]))) < 1e-9


def test_entropy_bonus_and_need_entropy():
    batch, out = batch_and_outputs(2)
    obj = Objective(
        policy_loss=spec(POLICY_LOSS_FN, "ppo"),
        entropy_loss=spec(ENTROPY_LOSS_FN, "entropy", coef=0.1),
        one_update=True,
    )
    assert obj.need_entropy
    assert not Objective(policy_loss=spec(POLICY_LOSS_FN, "ppo")).need_entropy
    l1, m = obj(out, batch)
    l0, _ = Objective(policy_loss=spec(POLICY_LOSS_FN, "ppo"), one_update=True)(out, batch)
    assert torch.allclose(l1 - l0, -0.1 * masked_mean(out["entropy"], batch["response_mask"]))


def test_objective_pickles_without_resolved_functions():
    obj = Objective(policy_loss=spec(POLICY_LOSS_FN, "ppo", clip_ratio_high=0.28), one_update=True)
    batch, out = batch_and_outputs()
    obj(out, batch)  # fills the cache
    clone = pickle.loads(pickle.dumps(obj))
    assert clone == obj
    assert torch.allclose(clone(out, batch)[0], obj(out, batch)[0])
    assert clone.inputs_needed() == {"logprob", "advantages", "action_mask"}


def test_rollout_logprob_diff_covers_sampled_rows_only():
    batch, out = batch_and_outputs()
    obj = Objective(policy_loss=spec(POLICY_LOSS_FN, "ppo"), one_update=True)
    _, metrics = obj(out, batch)
    assert "rollout_logprob_diff" not in metrics  # SFT-style data: nothing was sampled
    rollout = out["logprob"].detach() + 0.5
    rollout[0] += 10.0  # an expert row's zeros would look like a huge drift
    expert = torch.tensor([True, False, False, False])
    _, metrics = obj(out, {**batch, "rollout_logprob": rollout, "is_expert": expert})
    assert abs(metrics["rollout_logprob_diff"] - 0.5) < 1e-9


def test_engine_reports_whole_batch_policy_loss_over_micro_batches(tmp_path):
    """policy_loss is each micro-batch's share of the whole-batch loss: the engine sums it."""
    from trinity_like.models.tiny import build_tiny_model
    from trinity_like.trainer.local_engine import LocalEngine
    from trinity_like.trainer.params import ModelParams, OptimParams

    path = str(build_tiny_model(tmp_path / "tiny", seed=1))
    g = torch.Generator().manual_seed(0)
    B, P, R = 6, 3, 4
    batch = {
        "input_ids": torch.randint(3, 100, (B, P + R), generator=g),
        "attention_mask": torch.ones(B, P + R, dtype=torch.long),
        "position_ids": torch.arange(P + R).repeat(B, 1),
        "response_mask": torch.ones(B, R),
        "advantages": torch.randn(B, R, generator=g),
    }
    obj = Objective(policy_loss=spec(POLICY_LOSS_FN, "ppo"), one_update=True)
    split = LocalEngine(ModelParams(path=path, micro_batch_size=2), OptimParams(lr=0.0)).forward_backward(batch, obj)
    whole = LocalEngine(ModelParams(path=path, micro_batch_size=B), OptimParams(lr=0.0)).forward_backward(batch, obj)
    assert abs(split["policy_loss"] - whole["policy_loss"]) < 1e-5
    assert abs(split["policy_loss"] - split["loss"]) < 1e-6


def test_rollout_stats_leave_the_expert_rows_of_a_mix_batch_out():
    from trinity_like.pipeline.rl_loop import rollout_stats

    mask = torch.tensor([[1, 1, 0], [1, 0, 0], [1, 1, 1], [1, 1, 1]])
    batch = {
        "rewards": torch.tensor([1.0, 0.0, 0.0, 0.0]),
        "response_mask": mask,
        "is_expert": torch.tensor([False, False, True, True]),
        "model_version": torch.tensor([5, 4, 0, 0]),
    }
    got = rollout_stats(batch, model_version=6)
    assert got == {
        "expert_rows": 2.0,
        "reward/mean": 0.5,
        "reward/std": 0.5,
        "response_length/mean": 1.5,
        "response_length/max": 2.0,
        "staleness/mean": 1.5,
        "staleness/max": 2.0,
    }
    batch["is_expert"][:] = False
    got = rollout_stats(batch, model_version=6)
    assert "expert_rows" not in got and got["reward/mean"] == 0.25 and got["staleness/max"] == 6.0
