"""DPO and Bradley-Terry against hand-computed golden values (pair layout: rows 2i chosen, 2i + 1 rejected)."""

from __future__ import annotations

import math

import pytest
import torch
from _lib.algo_testlib import DT, autograd_grad

from trinity_like.components import build_params, call_component
from trinity_like.registry import POLICY_LOSS_FN

LN2 = math.log(2.0)


def bt(chosen, rejected, **extra):
    rows = [s for pair in zip(chosen, rejected) for s in pair] + list(rejected[len(chosen) :])
    scores = torch.tensor(rows, dtype=DT)
    return POLICY_LOSS_FN.get("bradley_terry")(scores=scores, **extra)


def softplus(x: float) -> float:  # -log sigmoid(-x), computed stably by hand
    return max(x, 0.0) + math.log1p(math.exp(-abs(x)))


# -- Bradley-Terry ----------------------------------------------------------------------------
def test_bt_equal_rewards_is_ln2():
    assert bt([1.5], [1.5])[0].item() == pytest.approx(LN2, abs=1e-12)


def test_bt_confident_pairs():
    assert bt([5.0], [-5.0])[0].item() == pytest.approx(math.log1p(math.exp(-10)), abs=1e-12)  # ~4.5e-5
    assert bt([5.0], [-5.0])[0].item() < 1e-4
    assert bt([-5.0], [5.0])[0].item() == pytest.approx(10.0, abs=1e-4)


def test_bt_batch_mean():
    loss, metrics = bt([2.0, 1.0], [1.0, 2.0])
    expected = (math.log1p(math.exp(-1)) + math.log1p(math.exp(1))) / 2
    assert loss.item() == pytest.approx(expected) and loss.item() == pytest.approx(0.8133, abs=1e-4)
    assert metrics["accuracy"] == 0.5 and metrics["margin"] == 0.0


def test_bt_empty_batch_is_exactly_zero():
    loss, metrics = bt([], [])
    assert loss.item() == 0.0 and math.copysign(1.0, loss.item()) == 1.0
    assert metrics["accuracy"] == 0.0


def test_bt_is_finite_at_extreme_margins():
    low, _ = bt([50.0], [0.0])
    high, _ = bt([-50.0], [0.0])
    assert math.isfinite(low.item()) and abs(low.item() - 0.0) < 1e-4
    assert math.isfinite(high.item()) and abs(high.item() - 50.0) < 1e-4


def test_bt_gradient_by_hand():
    # d/dr_c of -log sigmoid(r_c - r_r) = -sigmoid(r_r - r_c)
    g = autograd_grad(lambda s: POLICY_LOSS_FN.get("bradley_terry")(scores=s)[0], torch.tensor([1.0, 3.0], dtype=DT))
    s = 1 / (1 + math.exp(-(3.0 - 1.0)))
    assert g.tolist() == pytest.approx([-s, s])


def test_bt_rejects_an_odd_batch():
    with pytest.raises(ValueError, match="even"):
        bt([1.0], [2.0, 3.0])


# -- DPO ----------------------------------------------------------------------------------------
def dpo_batch(B=2, R=4, same=False, seed=0):
    g = torch.Generator().manual_seed(seed)
    ref = -torch.rand(2 * B, R, generator=g, dtype=DT) * 2
    lp = ref.clone() if same else ref + 0.5 * torch.randn(2 * B, R, generator=g, dtype=DT)
    mask = torch.ones(2 * B, R, dtype=DT)
    mask[0, -1] = mask[2 * B - 1, -2:] = 0  # ragged lengths
    return {"logprob": lp, "ref_logprob": ref, "action_mask": mask}


def dpo(batch, **params):
    fn = POLICY_LOSS_FN.get("dpo")
    return call_component(fn, batch, build_params(fn, params))


def test_dpo_is_log2_when_policy_equals_reference():
    for beta in (0.1, 1.0, 0.0):
        assert dpo(dpo_batch(same=True), beta=beta)[0].item() == LN2
    assert dpo(dpo_batch(same=True), label_smoothing=0.2)[0].item() == pytest.approx(LN2)


@pytest.mark.parametrize("beta", [0.1, 0.5])
def test_dpo_gradient_at_the_reference_is_minus_plus_beta_over_2(beta):
    b = dpo_batch(B=1, same=True)
    g = autograd_grad(lambda lp: dpo({**b, "logprob": lp}, beta=beta)[0], b["logprob"])
    # d/dz of -log sigmoid(z) at z = 0 is -1/2; dz/d logprob_chosen = beta, dz/d logprob_rejected = -beta
    assert torch.allclose(g[0], torch.where(b["action_mask"][0] > 0, -beta / 2, 0.0).to(DT))
    assert torch.allclose(g[1], torch.where(b["action_mask"][1] > 0, beta / 2, 0.0).to(DT))


def test_dpo_beta_zero_has_zero_gradient():
    b = dpo_batch()
    g = autograd_grad(lambda lp: dpo({**b, "logprob": lp}, beta=0.0)[0], b["logprob"])
    assert (g == 0).all()


def test_dpo_matches_the_formula_by_hand():
    b = dpo_batch(B=3, seed=4)
    beta, eps = 0.3, 0.1
    m = b["action_mask"]
    seq = ((b["logprob"] - b["ref_logprob"]) * m).sum(-1).tolist()
    zs = [beta * (seq[2 * i] - seq[2 * i + 1]) for i in range(3)]  # chosen 2i vs rejected 2i + 1
    expected = sum((1 - eps) * softplus(-z) + eps * softplus(z) for z in zs) / 3
    loss, metrics = dpo(b, beta=beta, label_smoothing=eps)
    assert loss.item() == pytest.approx(expected)
    assert metrics["reward_margin"] == pytest.approx(sum(zs) / 3)
    assert metrics["reward_accuracy"] == pytest.approx(sum(z > 0 for z in zs) / 3)
    assert metrics["reward_chosen"] == pytest.approx(beta * sum(seq[0::2]) / 3)


def test_pair_micro_batches_sum_to_the_full_batch():
    b = dpo_batch(B=4, seed=2)
    full, _ = dpo(b)

    def pairs(idx):  # a micro-batch of whole pairs, interleaved
        rows = [r for i in idx for r in (2 * i, 2 * i + 1)]
        return {k: v[rows] for k, v in b.items()}

    parts = [dpo({**pairs(idx), "num_seqs": 8}) for idx in ([0], [1, 2], [3])]
    assert sum(p[0].item() for p in parts) == pytest.approx(full.item())
    scores = torch.randn(8, dtype=DT)
    full, _ = POLICY_LOSS_FN.get("bradley_terry")(scores=scores)
    parts = [POLICY_LOSS_FN.get("bradley_terry")(scores=scores[[2 * i, 2 * i + 1]], num_seqs=8)[0] for i in range(4)]
    assert sum(p.item() for p in parts) == pytest.approx(full.item())


def test_fully_masked_pairs_count_for_nothing():
    """Padding pairs (added to even out data-parallel shards) change neither loss nor metrics."""
    b = dpo_batch(B=2, seed=5)
    loss, metrics = dpo({**b, "num_seqs": 4})
    padded = {k: torch.cat([v, v[-2:]]) for k, v in b.items()}
    padded["action_mask"][-2:] = 0
    loss_p, metrics_p = dpo({**padded, "num_seqs": 4})
    assert loss_p.item() == pytest.approx(loss.item()) and metrics_p == pytest.approx(metrics)
    scores = torch.tensor([1.0, 0.0, -1.0, 2.0, 5.0, 5.0], dtype=DT)
    mask = torch.ones(6, 3, dtype=DT)
    mask[4:] = 0
    bt_fn = POLICY_LOSS_FN.get("bradley_terry")
    loss_p, metrics_p = bt_fn(scores=scores, action_mask=mask, num_seqs=4)
    loss, metrics = bt_fn(scores=scores[:4])
    assert loss_p.item() == pytest.approx(loss.item()) and metrics_p == pytest.approx(metrics)
