"""Policy losses: hand-computed values, degenerate cases, micro-batch additivity, params validation."""

from __future__ import annotations

import math

import pytest
import torch
from _lib.algo_testlib import DT, autograd_grad, rand_batch

from trinity_like import ops
from trinity_like.components import build_params, call_component
from trinity_like.errors import ConfigError
from trinity_like.registry import ENTROPY_LOSS_FN, POLICY_LOSS_FN


def run(name, batch, registry=POLICY_LOSS_FN, **params):
    fn = registry.get(name)
    return call_component(fn, batch, build_params(fn, params))


def one_token(ratio: float, adv: float):
    """A batch of one token with pi/pi_old = ratio and advantage adv."""
    old = torch.tensor([[math.log(0.5)]], dtype=DT)
    return {
        "logprob": old + math.log(ratio),
        "old_logprob": old,
        "advantages": torch.tensor([[adv]], dtype=DT),
        "action_mask": torch.ones(1, 1, dtype=DT),
    }


def grad_wrt_logprob(name, batch, **params):
    return autograd_grad(lambda lp: run(name, {**batch, "logprob": lp}, **params)[0], batch["logprob"])


# -- PPO by hand ------------------------------------------------------------------------
@pytest.mark.parametrize(
    "ratio, adv, high, loss, grad",
    [
        (1.5, 2.0, 0.2, -2.0 * 1.2, 0.0),  # A > 0, ratio above 1 + eps: clipped, no gradient
        (0.5, 2.0, 0.2, -2.0 * 0.5, -2.0 * 0.5),  # A > 0, ratio below 1 - eps: not clipped (pessimistic min)
        (0.5, -2.0, 0.2, 2.0 * 0.8, 0.0),  # A < 0, ratio below 1 - eps: clipped
        (1.25, 1.0, 0.2, -1.2, 0.0),  # clipped at 1.2 ...
        (1.25, 1.0, 0.28, -1.25, -1.25),  # ... but not with DAPO's clip-higher 0.28
    ],
)
def test_ppo_clip_by_hand(ratio, adv, high, loss, grad):
    b = one_token(ratio, adv)
    value, metrics = run("ppo", b, clip_ratio_high=high)
    assert value.item() == pytest.approx(loss)
    # d(-A r)/d logprob = -A r (r = exp(logprob - old))
    assert grad_wrt_logprob("ppo", b, clip_ratio_high=high).item() == pytest.approx(grad)
    assert metrics["clip_frac"] == (1.0 if grad == 0.0 else 0.0)


def test_dual_clip_bounds_a_negative_advantage():
    b = one_token(ratio=5.0, adv=-1.0)
    plain, _ = run("ppo", b)
    dual, metrics = run("ppo", b, clip_ratio_c=3.0)
    assert plain.item() == pytest.approx(5.0) and dual.item() == pytest.approx(3.0)
    assert metrics["clip_frac_lower"] == 1.0
    assert grad_wrt_logprob("ppo", b, clip_ratio_c=3.0).item() == 0.0
    # a positive advantage is untouched by the dual clip
    b = one_token(ratio=0.5, adv=1.0)
    assert run("ppo", b, clip_ratio_c=3.0)[0].item() == run("ppo", b)[0].item()


def test_clip_range_to_infinity_is_vanilla_policy_gradient():
    b = rand_batch()
    wide = {"clip_ratio_low": 1.0, "clip_ratio_high": 1e12}
    assert run("ppo", b, **wide)[0].item() == pytest.approx(run("importance_sampling", b)[0].item(), rel=1e-12)
    assert torch.allclose(grad_wrt_logprob("ppo", b, **wide), grad_wrt_logprob("importance_sampling", b))
    # at ratio 1 that is -A * grad log pi, i.e. REINFORCE: gradient -A / (number of tokens)
    on = {**b, "logprob": b["old_logprob"].clone()}
    expected = -b["advantages"] * b["action_mask"] / b["action_mask"].sum()
    assert torch.allclose(grad_wrt_logprob("ppo", on, **wide), expected)


@pytest.mark.parametrize("name", ["ppo", "importance_sampling", "gspo", "cispo", "mix"])
@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_at_ratio_one_the_gradient_pushes_logprob_along_the_advantage(name, sign):
    b = rand_batch()
    b = {**b, "logprob": b["old_logprob"].clone(), "is_expert": torch.zeros(6, dtype=torch.bool)}
    b["advantages"] = sign * (b["advantages"].abs() + 0.1)
    b["advantages"] = b["advantages"][:, :1].expand_as(b["advantages"]).clone()  # per-sequence (GSPO)
    g = grad_wrt_logprob(name, b)
    on = b["action_mask"] > 0
    assert (torch.sign(g[on]) == -sign).all()  # descending the loss raises logprob iff A > 0
    assert (g[~on] == 0).all()


# -- the other policy losses by hand --------------------------------------------------------
def test_importance_sampling_by_hand():
    assert run("importance_sampling", one_token(1.7, 0.5))[0].item() == pytest.approx(-0.5 * 1.7)


def test_cispo_keeps_the_gradient_of_clipped_tokens_with_a_capped_weight():
    b = one_token(ratio=2.0, adv=1.5)
    value, metrics = run("cispo", b, clip_ratio_high=0.2)
    assert value.item() == pytest.approx(-1.2 * 1.5 * math.log(1.0))  # logprob = log(0.5 * 2) = 0
    assert grad_wrt_logprob("cispo", b, clip_ratio_high=0.2).item() == pytest.approx(-1.2 * 1.5)
    assert metrics["clip_frac"] == 1.0
    b = one_token(ratio=1.1, adv=1.5)  # inside the range: weight = ratio
    assert grad_wrt_logprob("cispo", b).item() == pytest.approx(-1.1 * 1.5)


def test_gspo_uses_the_length_normalised_sequence_ratio():
    lp = torch.tensor([[0.1, 0.3, 9.0], [0.2, 0.0, 0.0]], dtype=DT)
    b = {
        "logprob": lp - 1.0,
        "old_logprob": torch.full_like(lp, -1.0),
        "advantages": torch.tensor([[1.0, 1.0, 1.0], [-2.0, -2.0, -2.0]], dtype=DT),
        "action_mask": torch.tensor([[1, 1, 0], [1, 0, 0]], dtype=DT),
    }
    s = [math.exp((0.1 + 0.3) / 2), math.exp(0.2)]  # ratio of the sequence, per token geometric mean
    value, _ = run("gspo", b, clip_ratio_low=0.99, clip_ratio_high=100.0)  # no clipping
    assert value.item() == pytest.approx((-1.0 * s[0] + 2.0 * s[1]) / 2)
    clipped, _ = run("gspo", b)  # default clip range 3e-4 / 4e-4
    assert clipped.item() == pytest.approx((-1.0 * (1 + 4e-4) + 2.0 * s[1]) / 2)


def test_sft_is_the_mean_negative_log_likelihood():
    b = rand_batch()
    m = b["action_mask"]
    expected = -(b["logprob"] * m).sum() / m.sum()
    value, metrics = run("sft", b)
    assert value.item() == pytest.approx(expected.item()) and metrics["nll"] == pytest.approx(expected.item())


def test_value_clip_by_hand():
    b = {
        "values": torch.tensor([[2.0, 0.1]], dtype=DT),
        "old_values": torch.tensor([[0.0, 0.0]], dtype=DT),
        "returns": torch.tensor([[3.0, 1.0]], dtype=DT),
        "action_mask": torch.ones(1, 2, dtype=DT),
    }
    # token 0: clipped value 0.5 -> max((2-3)^2, (0.5-3)^2) = 6.25; token 1: inside the range -> 0.81
    value, metrics = run("value_clip", b, cliprange_value=0.5)
    assert value.item() == pytest.approx(0.5 * (6.25 + 0.81) / 2)
    assert metrics["vf_clipfrac"] == 0.5


def test_entropy_bonus_is_minus_the_mean_token_entropy():
    # unweighted: the slot's coef (algorithm.entropy_loss.coef) is applied by the objective
    b = rand_batch()
    m = b["action_mask"]
    value, _ = run("entropy", b, registry=ENTROPY_LOSS_FN)
    assert value.item() == pytest.approx(-((b["entropy"] * m).sum() / m.sum()).item())


# -- MIX ------------------------------------------------------------------------------------
def test_mix_is_the_weighted_sum_of_grpo_on_rollouts_and_sft_on_experts():
    b = rand_batch(empty_rows=0)
    expert = b["is_expert"]
    rows = {k: v[~expert] for k, v in b.items()}
    experts = {k: v[expert] for k, v in b.items()}
    mu = 0.3
    expected = (1 - mu) * run("ppo", rows)[0] + mu * run("sft", experts)[0]
    b["old_logprob"] = torch.where(expert.unsqueeze(-1), float("nan"), b["old_logprob"])  # experts have none
    value, metrics = run("mix", b, mu=mu)
    assert value.item() == pytest.approx(expected.item())
    assert torch.isfinite(grad_wrt_logprob("mix", b, mu=mu)).all()
    assert metrics["expert_frac"] == pytest.approx(expert.float().mean().item())


def test_mix_needs_the_expert_counts_with_global_normalisers():
    b = rand_batch()
    with pytest.raises(ValueError, match="num_expert_tokens"):
        run("mix", {**b, **ops.normalizers(b["action_mask"])})


# -- micro-batches ----------------------------------------------------------------------------
TOKEN_LOSSES = ["ppo", "importance_sampling", "gspo", "cispo", "sft", "value_clip", "mix"]


@pytest.mark.parametrize("name", TOKEN_LOSSES + ["entropy"])
@pytest.mark.parametrize("mode", ops.AGG_MODES)
def test_micro_batch_losses_sum_to_the_full_batch_loss(name, mode):
    registry = ENTROPY_LOSS_FN if name == "entropy" else POLICY_LOSS_FN
    b = rand_batch(B=9, R=5, empty_rows=2)
    params = {"loss_agg_mode": mode, "loss_scale_factor": 5}
    full, _ = run(name, {**b, **ops.normalizers(b["action_mask"], b["is_expert"])}, registry, **params)
    norm = ops.normalizers(b["action_mask"], b["is_expert"])
    parts = [
        run(name, {**{k: v[i : i + 2] for k, v in b.items()}, **norm}, registry, **params)[0] for i in range(0, 9, 2)
    ]
    local_full, _ = run(name, b, registry, **params)  # without normalisers: the batch's own counts
    assert torch.stack(parts).sum().item() == pytest.approx(full.item(), rel=1e-10)
    assert local_full.item() == pytest.approx(full.item(), rel=1e-10)


# -- params ---------------------------------------------------------------------------------
def test_params_are_validated():
    ppo = POLICY_LOSS_FN.get("ppo")
    with pytest.raises(ConfigError, match="clip_ratio_high"):
        build_params(ppo, {"clip_ratio_hihg": 0.28})
    with pytest.raises(ConfigError, match="loss_agg_mode"):
        build_params(ppo, {"loss_agg_mode": "mean"})
    with pytest.raises(ConfigError):
        build_params(ppo, {"clip_ratio_c": 0.5})
    with pytest.raises(ConfigError):
        build_params(POLICY_LOSS_FN.get("mix"), {"mu": 1.5})
    assert build_params(ppo, {"clip_ratio_high": "0.28"}).clip_ratio_high == 0.28


@pytest.mark.parametrize("name", POLICY_LOSS_FN.names())
def test_every_loss_returns_a_scalar_and_float_metrics(name):
    b = rand_batch()
    b["scores"] = torch.randn(6, dtype=DT)
    loss, metrics = run(name, b)
    assert loss.dim() == 0 and torch.isfinite(loss)
    assert metrics and all(isinstance(v, float) for v in metrics.values())
