"""The inverse-CDF sampler against a naive loop and against the distribution it claims."""

from __future__ import annotations

import math

import pytest
import torch

from trinity_like.explorer.sampling import greedy_tokens, sample_tokens


def naive_inverse_cdf(probs, u):
    """First index whose running total exceeds u * total, by a Python loop."""
    total = sum(probs)
    acc = 0.0
    for i, p in enumerate(probs):
        acc += p
        if acc > u * total:
            return i
    return max(i for i, p in enumerate(probs) if p > 0)


def test_matches_naive_loop_on_a_grid_of_uniforms():
    logits = torch.tensor([[0.3, -1.0, 2.0, 0.0, -5.0, 1.1]])
    probs = torch.softmax(logits[0].double() / 0.8, -1).tolist()
    for k in range(200):
        u = (k + 0.37) / 200
        token, logprob = sample_tokens(logits, torch.tensor([u], dtype=torch.float64), temperature=0.8)
        want = naive_inverse_cdf(probs, u)
        assert int(token) == want
        assert math.isclose(float(logprob), math.log(probs[want]), abs_tol=1e-5)


def test_frequencies_follow_softmax():
    torch.manual_seed(0)
    logits = torch.randn(1, 10) * 1.5
    n = 20000
    u = torch.rand(n, dtype=torch.float64)
    tokens, _ = sample_tokens(logits.expand(n, -1), u, temperature=1.0)
    freq = torch.bincount(tokens, minlength=10).double() / n
    probs = torch.softmax(logits[0].double(), -1)
    # 5 standard errors per bin: a wrong distribution fails, noise does not.
    assert ((freq - probs).abs() <= 5 * (probs * (1 - probs) / n).sqrt() + 1e-9).all()


def test_top_k_and_top_p_never_leave_the_support():
    logits = torch.tensor([[5.0, 4.0, 3.0, 0.0, -1.0, -2.0]])
    u = torch.linspace(0, 0.999999, 500, dtype=torch.float64)
    tokens, _ = sample_tokens(logits.expand(500, -1), u, temperature=1.0, top_k=2)
    assert set(tokens.tolist()) == {0, 1}
    probs = torch.softmax(logits[0], -1)  # [0.66, 0.24, 0.09, ...]: top_p=0.8 keeps 0 and 1
    tokens, logprob = sample_tokens(logits.expand(500, -1), u, temperature=1.0, top_p=0.8)
    assert set(tokens.tolist()) == {0, 1}
    renorm = probs[:2] / probs[:2].sum()
    assert torch.allclose(logprob[tokens == 0][0], renorm[0].log(), atol=1e-6)


def test_extreme_uniforms_never_pick_zero_mass_tokens():
    logits = torch.tensor([[float("-inf"), 0.0, float("-inf"), 1.0, float("-inf")]])
    for u in (0.0, 1.0 - 1e-16, 0.5):
        token, logprob = sample_tokens(logits, torch.tensor([u], dtype=torch.float64), temperature=1.0)
        assert int(token) in (1, 3) and math.isfinite(float(logprob))


def test_greedy_reports_model_logprob():
    logits = torch.tensor([[1.0, 3.0, 2.0]])
    token, logprob = greedy_tokens(logits)
    assert int(token) == 1
    assert math.isclose(float(logprob), float(torch.log_softmax(logits, -1)[0, 1]), abs_tol=1e-6)


def _splitmix64(seed: int, i: int) -> float:
    """Reference SplitMix64 in plain Python integers (Steele et al. 2014)."""
    mask = 2**64 - 1
    z = (seed + (i + 1) * 0x9E3779B97F4A7C15) & mask
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & mask
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & mask
    z ^= z >> 31
    return (z >> 11) * 2.0**-53


def test_uniforms_are_splitmix64_and_uniform():
    """Torch int64 arithmetic (wrapping, logical shifts by mask) gives SplitMix64's exact bits,
    against the arbitrary-precision Python oracle above -- seeds above 2**63 included."""
    from trinity_like.explorer.sampling import seed_bits, uniforms

    seeds = [0, 1, 12345, 2**63 + 7, 2**64 - 1]
    draws = [0, 5, 1, 99, 3]
    got = uniforms(torch.tensor([seed_bits(s) for s in seeds]), torch.tensor(draws)).tolist()
    assert got == [_splitmix64(s, i) for s, i in zip(seeds, draws)]
    many = uniforms(torch.arange(50_000), torch.zeros(50_000, dtype=torch.long))
    assert abs(float(many.mean()) - 0.5) < 0.01 and float(many.min()) >= 0.0 and float(many.max()) < 1.0


@pytest.mark.gpu
def test_uniforms_and_draws_are_the_same_on_cuda():
    """The counter-based stream is bit-identical on the GPU, and so are the tokens it draws."""
    from trinity_like.explorer.sampling import seed_bits, uniforms

    seeds = torch.tensor([seed_bits(s) for s in (3, 2**63 + 11, 2**64 - 5, 987654321)])
    draws = torch.tensor([0, 7, 255, 4096])
    assert torch.equal(uniforms(seeds, draws), uniforms(seeds.cuda(), draws.cuda()).cpu())
    logits = torch.randn(4, 50, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    u = uniforms(seeds, draws)
    want = sample_tokens(logits, u, temperature=0.9, top_k=20, top_p=0.9)
    got = sample_tokens(logits.cuda(), u.cuda(), temperature=0.9, top_k=20, top_p=0.9)
    assert torch.equal(want[0], got[0].cpu()) and torch.allclose(want[1], got[1].cpu(), atol=1e-9)


@pytest.mark.parametrize("temperature", [1e-257, 1e-45, 1e-31, 1e-20])
def test_a_vanishing_temperature_is_the_greedy_limit(temperature):
    """logits / 1e-257 overflows float32 (inf - inf = NaN once the max is subtracted); whatever the
    temperature, the draw is the argmax -- ties split between the tied -- with logprob log(1 / ties)."""
    logits = torch.tensor([[0.3, 4.0, -2.0, 3.999, -50.0], [2.0, -1.0, 2.0, 0.5, -3.0]])
    u = torch.tensor([0.1, 0.9], dtype=torch.float64)
    for top_k, top_p in ((0, 1.0), (3, 1.0), (0, 0.5)):
        tokens, logprob = sample_tokens(logits, u, temperature=temperature, top_k=top_k, top_p=top_p)
        assert tokens[0] == 1 and math.isclose(float(logprob[0]), 0.0, abs_tol=1e-6)
        assert int(tokens[1]) in (0, 2) and math.isfinite(float(logprob[1]))
    tokens, logprob = sample_tokens(logits, u, temperature=temperature)
    assert tokens.tolist() == [1, 2] and math.isclose(float(logprob[1]), math.log(0.5), abs_tol=1e-6)


@pytest.mark.parametrize("top_p", [1e-50, 1e-40, 0.0, -1.0])
def test_a_top_p_that_rounds_to_zero_keeps_the_most_likely_token(top_p):
    logits = torch.randn(64, 100, generator=torch.Generator().manual_seed(3))
    u = torch.rand(64, dtype=torch.float64, generator=torch.Generator().manual_seed(4))
    tokens, logprob = sample_tokens(logits, u, temperature=1.0, top_p=top_p)
    assert torch.equal(tokens, logits.argmax(-1)) and torch.allclose(logprob, torch.zeros(64))


def test_nan_logits_never_draw_past_the_vocabulary():
    logits = torch.full((3, 7), float("nan"))
    u = torch.tensor([0.0, 0.5, 0.999], dtype=torch.float64)
    for kwargs in ({}, {"top_k": 3}, {"top_p": 0.9}):
        tokens, logprob = sample_tokens(logits, u, temperature=1.0, **kwargs)
        assert ((tokens >= 0) & (tokens < 7)).all() and torch.isnan(logprob).all()
