"""trinity_like.ops: aggregation modes by hand, micro-batch additivity, group ops against naive loops."""

from __future__ import annotations

import math

import pytest
import torch
from _lib.algo_testlib import DT, rand_batch, rand_mask

from trinity_like import ops

LOSS = torch.tensor([[1.0, 3.0, 9.0, 9.0], [2.0, 4.0, 6.0, 9.0], [7.0, 7.0, 7.0, 7.0]], dtype=DT)
MASK = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 0], [0, 0, 0, 0]], dtype=DT)  # third row empty


@pytest.mark.parametrize(
    "mode, expected",
    [
        ("token-mean", (1 + 3 + 2 + 4 + 6) / 5),
        ("token-sum", 1 + 3 + 2 + 4 + 6),
        ("seq-mean-token-sum", (4 + 12) / 2),  # empty rows are not sequences
        ("seq-mean-token-mean", (2 + 4) / 2),
        ("seq-mean-token-sum-norm", (4 + 12) / 2 / 4),  # divided by the width R = 4
    ],
)
def test_modes_by_hand(mode, expected):
    assert ops.aggregate(LOSS, MASK, mode).item() == pytest.approx(expected)


def test_seq_mean_token_sum_norm_takes_a_constant_length():
    assert ops.aggregate(LOSS, MASK, "seq-mean-token-sum-norm", loss_scale_factor=16).item() == pytest.approx(8 / 16)


def test_unknown_mode_lists_the_modes():
    with pytest.raises(ValueError, match="token-mean"):
        ops.aggregate(LOSS, MASK, "token_mean")


def test_empty_mask_gives_zero_not_nan():
    zero = torch.zeros_like(MASK)
    for mode in ops.AGG_MODES:
        assert ops.aggregate(LOSS, zero, mode).item() == 0.0
    assert ops.masked_mean(LOSS, zero).item() == 0.0


def test_values_under_a_zero_mask_are_ignored_even_nan():
    loss = LOSS.clone()
    loss[MASK == 0] = float("nan")
    for mode in ops.AGG_MODES:
        assert ops.aggregate(loss, MASK, mode).item() == ops.aggregate(LOSS, MASK, mode).item()


def test_mask_weights_scale_a_token_and_are_not_normalised_away():
    half = MASK.clone()
    half[1] *= 0.5  # down-weight row 1 (the staleness strategy does this)
    assert ops.aggregate(LOSS, half, "token-mean").item() == pytest.approx((1 + 3 + 0.5 * 12) / 5)
    assert ops.aggregate(LOSS, half, "seq-mean-token-mean").item() == pytest.approx((2 + 0.5 * 4) / 2)
    assert ops.aggregate(LOSS, half, "seq-mean-token-sum").item() == pytest.approx((4 + 0.5 * 12) / 2)


@pytest.mark.parametrize("mode", ops.AGG_MODES)
@pytest.mark.parametrize("micro", [1, 2, 3, 5])
def test_micro_batches_sum_to_the_full_batch(mode, micro):
    g = torch.Generator().manual_seed(3)
    loss = torch.randn(11, 6, generator=g, dtype=DT)
    mask = rand_mask(11, 6, g, empty_rows=2)
    full = ops.aggregate(loss, mask, mode)
    norm = ops.normalizers(mask)
    parts = [
        ops.aggregate(loss[i : i + micro], mask[i : i + micro], mode, **norm, loss_scale_factor=6)
        for i in range(0, 11, micro)
    ]
    assert torch.stack(parts).sum().item() == pytest.approx(full.item(), rel=1e-12)


def test_normalizers_count_tokens_rows_and_expert_rows():
    expert = torch.tensor([False, True, True])
    n = ops.normalizers(MASK, expert)
    assert {k: v.item() for k, v in n.items()} == {
        "num_tokens": 5,
        "num_seqs": 2,
        "num_expert_tokens": 3,
        "num_expert_seqs": 1,
    }


def _naive_groups(values, index):
    groups: dict[int, list[float]] = {}
    for v, i in zip(values.tolist(), index.tolist()):
        groups.setdefault(i, []).append(v)
    return groups


def test_group_stats_matches_a_naive_loop():
    g = torch.Generator().manual_seed(0)
    index = torch.tensor([7, 3, 7, 7, 100, 3, 42, 3, 3])  # non-contiguous ids, a group of one
    values = torch.randn(9, generator=g, dtype=DT)
    mean, std, size = ops.group_stats(values, index)
    groups = _naive_groups(values, index)
    for row, i in enumerate(index.tolist()):
        vs = groups[i]
        m = sum(vs) / len(vs)
        s = math.sqrt(sum((v - m) ** 2 for v in vs) / (len(vs) - 1)) if len(vs) > 1 else 0.0
        assert (mean[row].item(), std[row].item(), size[row].item()) == pytest.approx((m, s, len(vs)))


def test_groups_with_signal_matches_a_naive_loop():
    index = torch.tensor([0, 0, 1, 1, 1, 2, 3, 3])
    rewards = torch.tensor([1.0, 1.0, 0.0, 1.0, 0.0, 5.0, 2.0, 2.5])
    groups = _naive_groups(rewards, index)
    expected = [len(set(groups[i])) > 1 for i in index.tolist()]
    assert (
        ops.groups_with_signal(rewards, index).tolist()
        == expected
        == [False, False, True, True, True, False, True, True]
    )


def test_the_group_filter_against_a_baseline_matches_a_naive_loop():
    """The client loop's filter (advantages all 0) and the recipe loop's (rewards all equal) are
    one function; with a baseline a group of equal non-zero values carries a signal, a NaN too."""
    groups = [[0.0, 0.0, -0.0], [0.5, 0.5], [0.0, 1e-12], [], [float("nan"), 0.0], [2.0, 2.0]]
    naive_zero = [any(v for v in g) for g in groups]
    naive_equal = [len(set(g)) > 1 for g in groups]
    assert ops.kept_groups(groups, baseline=0.0) == naive_zero == [False, True, True, False, True, True]
    equal = ops.kept_groups([g for g in groups if not any(math.isnan(v) for v in g)])
    assert equal == [e for g, e in zip(groups, naive_equal, strict=True) if not any(math.isnan(v) for v in g)]
    assert equal == [False, False, True, False, False]


def test_last_token_helpers_match_a_naive_loop():
    mask = torch.tensor([[0, 1, 1, 1, 0], [1, 1, 0, 0, 0], [0, 0, 0, 0, 0], [1, 0, 1, 0, 1]])
    last = [max((j for j in range(5) if mask[i, j]), default=0) for i in range(4)]
    assert ops.last_token_index(mask).tolist() == last == [3, 1, 0, 4]
    placed = ops.token_level_rewards(torch.tensor([1.0, 2.0, 3.0, 4.0]), mask[[0, 1, 3]])
    assert placed.tolist() == [[0, 0, 0, 1, 0], [0, 2, 0, 0, 0], [0, 0, 0, 0, 3]]


def test_kl_term_with_coefficient_zero_is_no_term():
    b = rand_batch()
    kl = torch.full_like(b["logprob"], float("inf"))
    loss, metrics = ops.kl_loss_term(kl, b["action_mask"], coef=0.0)
    assert loss.item() == 0.0 and metrics["kl_coef"] == 0.0
    rewards = torch.randn_like(b["logprob"])
    shaped, _ = ops.apply_kl_penalty(rewards, kl, b["action_mask"], coef=0.0)
    assert torch.equal(shaped, rewards)


def test_kl_term_and_penalty_by_hand():
    kl = torch.tensor([[0.5, 1.5, 9.0]], dtype=DT)
    mask = torch.tensor([[1.0, 1.0, 0.0]], dtype=DT)
    loss, _ = ops.kl_loss_term(kl, mask, coef=0.1)
    assert loss.item() == pytest.approx(0.1 * 1.0)
    shaped, _ = ops.apply_kl_penalty(torch.tensor([[0.0, 1.0, 0.0]], dtype=DT), kl, mask, coef=0.1)
    assert shaped[0].tolist() == pytest.approx([-0.05, 1.0 - 0.15, 0.0])
