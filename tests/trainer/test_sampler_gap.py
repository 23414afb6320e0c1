"""The sampler-trainer gap (trainer/objective.py ``sampler_gap``) against a plain per-token loop.

Oracle: for every sampled, trained token, r = exp(logprob - rollout_logprob), k3 = r - 1 - log r
(Schulman 2020), written with ``math`` in Python floats, token by token.
"""

from __future__ import annotations

import math

import pytest
import torch

from trinity_like.trainer.objective import sampler_gap


def oracle(logprob, rollout, mask, is_expert):
    k3, diffs = [], []
    for b in range(logprob.shape[0]):
        if is_expert is not None and bool(is_expert[b]):
            continue
        for j in range(logprob.shape[1]):
            if mask[b, j] > 0:
                d = float(logprob[b, j]) - float(rollout[b, j])
                k3.append(math.exp(d) - 1 - d)
                diffs.append(abs(d))
    return sum(k3) / len(k3), max(diffs), sum(diffs) / len(diffs)


@pytest.mark.parametrize("with_expert", [False, True])
def test_the_gap_is_the_per_token_loop(with_expert):
    g = torch.Generator().manual_seed(5)
    logprob = -torch.rand(6, 9, generator=g) * 4
    rollout = logprob + torch.randn(6, 9, generator=g) * 0.3
    mask = (torch.rand(6, 9, generator=g) > 0.3).float()
    is_expert = torch.tensor([False, True, False, False, True, False]) if with_expert else None
    if with_expert:
        rollout[1] = 0.0  # expert rows carry no sampler logprobs: a huge "gap" that must not count
        rollout[4] = 0.0
    got = sampler_gap(logprob.requires_grad_(), rollout, mask, is_expert)
    kl, most, mean = oracle(logprob.detach(), rollout, mask, is_expert)
    assert got["train/sampler_kl_k3"] == pytest.approx(kl, rel=1e-9)
    assert got["train/sampler_logprob_diff_max"] == pytest.approx(most, rel=1e-6)
    assert got["train/sampler_logprob_diff_mean"] == pytest.approx(mean, rel=1e-6)
    assert got["train/sampler_kl_k3"] > 0


def test_equal_logprobs_give_no_gap_and_no_sampled_tokens_give_no_metrics():
    logprob = -torch.rand(3, 4)
    mask = torch.ones(3, 4)
    got = sampler_gap(logprob, logprob.clone(), mask, torch.zeros(3, dtype=torch.bool))
    assert got == {
        "train/sampler_kl_k3": 0.0,
        "train/sampler_logprob_diff_max": 0.0,
        "train/sampler_logprob_diff_mean": 0.0,
    }
    assert sampler_gap(logprob, logprob, mask, torch.ones(3, dtype=torch.bool)) == {}  # expert rows only
    assert sampler_gap(logprob, logprob, torch.zeros(3, 4), None) == {}
