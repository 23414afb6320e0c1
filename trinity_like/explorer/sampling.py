"""Drawing the next token, and its logprob under the sampling distribution, cheaply.

Why not ``log_softmax`` + ``multinomial``: over a 49k vocabulary at batch 128 that costs
about 170 ms a step on one CPU core (docs/machines.md, "Baselines"), a fifth of decoding. Inverse-CDF
sampling needs one uniform number per row and a few vectorised passes over the logits
(max, exp, cumsum, sum) and one ``searchsorted``; the logprob of the drawn token is its
logit minus the log-partition, so no full ``log_softmax`` is ever materialised. One
uniform per row per step (rather than one per vocabulary entry, as the Gumbel-max trick
needs) also lets every sequence own its random stream: a sample's tokens depend on its
seed alone, not on which other sequences share the batch.

Letters: B rows, V vocabulary, K kept candidates (top-k / top-p).
"""

from __future__ import annotations

import torch


def _signed(c: int) -> int:
    """A 64-bit constant as the int64 with the same bits (torch has no full uint64 arithmetic)."""
    return c - 2**64 if c >= 2**63 else c


_GOLDEN = _signed(0x9E3779B97F4A7C15)
_MIX1 = _signed(0xBF58476D1CE4E5B9)
_MIX2 = _signed(0x94D049BB133111EB)


def _shift_right(z: torch.Tensor, k: int) -> torch.Tensor:
    """Logical right shift of int64 bit patterns (``>>`` on int64 is arithmetic: it copies the sign bit)."""
    return (z >> k) & ((1 << (64 - k)) - 1)


def uniforms(seeds_B: torch.Tensor, draws_B: torch.Tensor) -> torch.Tensor:
    """U[0, 1) float64 numbers: the ``draws_B``-th output of SplitMix64 seeded with ``seeds_B``.

    Counter-based: a row's number depends on its seed and draw index only, so it needs no
    generator state and the whole batch is drawn in a few vectorised integer operations
    on whatever device the tensors are (SplitMix64, Steele et al. 2014). The arithmetic is
    int64 wrapping modulo 2**64 -- the same bits as uint64 -- so CPU and CUDA give identical
    numbers for the same (seed, draw), and the engine's decode step can be captured in a
    CUDA graph: nothing leaves the device. ``seeds_B``: int64 bit patterns of 64-bit seeds;
    ``draws_B``: int64 draw indices (the sample's tokens so far).
    """
    z = torch.add(seeds_B, draws_B + 1, alpha=_GOLDEN)  # seeds + (draws + 1) * golden, one operation
    z = (z ^ _shift_right(z, 30)) * _MIX1
    z = (z ^ _shift_right(z, 27)) * _MIX2
    z = z ^ _shift_right(z, 31)
    return _shift_right(z, 11).double() * 2.0**-53


def seed_bits(seed: int) -> int:
    """A Python seed as the int64 :func:`uniforms` takes: its low 64 bits, as a signed value."""
    return _signed(seed % 2**64)


_BELOW_ONE = 1.0 - 2.0**-24  # the largest float32 below 1


def _inverse_cdf(scores_BK: torch.Tensor, u_B: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Index drawn from softmax(scores) with uniforms ``u_B``, and its log-probability.

    ``-inf`` scores have probability zero and are never drawn.
    """
    max_B1 = scores_BK.max(dim=-1, keepdim=True).values
    shifted_BK = scores_BK - max_B1
    weights_BK = shifted_BK.exp()
    cdf_BK = weights_BK.cumsum(dim=-1)
    total_B1 = cdf_BK[:, -1:]
    # Target strictly below the total so `searchsorted(right=True)` lands on an index
    # whose weight is positive (c[i-1] <= t < c[i] implies w[i] > 0).
    target_B1 = (u_B.unsqueeze(1) * total_B1.double()).to(cdf_BK.dtype)
    # The float32 just below the total, nextafter(total, 0), as one multiplication: total >= 1 (the
    # maximum's weight is exp(0)), and total * (1 - 2**-24) rounds to total - ulp (exactly so at a power of two).
    target_B1 = torch.minimum(target_B1, total_B1 * _BELOW_ONE)
    # Clamped: NaN logits (a broken model) must not index past the candidates -- the NaN logprob
    # that comes with the draw is what reports them.
    index_B1 = torch.searchsorted(cdf_BK, target_B1, right=True).clamp_(max=scores_BK.shape[-1] - 1)
    # The log-partition from a pairwise sum (more accurate than the cumsum's last entry).
    log_z_B1 = weights_BK.sum(dim=-1, keepdim=True).log_()
    logprob_B = (shifted_BK.gather(1, index_B1) - log_z_B1).squeeze(1)
    return index_B1.squeeze(1), logprob_B


# Below this, logits / temperature may overflow float32 (|logit| up to ~1e4): the row's maximum is
# subtracted first, so the most likely token scores 0 and the rest tend to -inf (the greedy limit).
_SAFE_TEMPERATURE = 1e-30


def _tempered(scores_BV: torch.Tensor, temperature: float) -> torch.Tensor:
    """``scores / temperature`` without inf - inf: tiny temperatures divide the max-shifted scores."""
    if temperature == 1.0:
        return scores_BV  # x / 1 == x exactly: one pass over the logits saved
    if temperature >= _SAFE_TEMPERATURE:
        return scores_BV / temperature
    shifted_BV = scores_BV - scores_BV.max(dim=-1, keepdim=True).values
    return shifted_BV / max(temperature, torch.finfo(torch.float32).tiny)


def sample_tokens(
    logits_BV: torch.Tensor,
    u_B: torch.Tensor,
    *,
    temperature: float,
    top_k: int = 0,
    top_p: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Draw one token per row from softmax(logits / temperature), truncated by top-k/top-p.

    Returns ``(token_B, logprob_B)``: the logprob is under the distribution actually
    sampled from (temperature applied, truncated and renormalised), which is what an
    importance ratio against the trained policy needs. Top-k is applied before top-p, as in
    ``transformers``; top-p keeps the smallest prefix of the sorted candidates whose mass
    reaches ``top_p``.
    """
    scores_BV = _tempered(logits_BV.float(), temperature)
    vocab = scores_BV.shape[-1]
    if top_k <= 0 and top_p >= 1.0:
        return _inverse_cdf(scores_BV, u_B)
    if 0 < top_k < vocab:
        scores_BK, ids_BK = scores_BV.topk(top_k, dim=-1)
    else:
        scores_BK, ids_BK = scores_BV.sort(dim=-1, descending=True)
    if top_p < 1.0:
        probs_BK = torch.softmax(scores_BK, dim=-1)
        mass_before_BK = probs_BK.cumsum(dim=-1) - probs_BK
        drop_BK = mass_before_BK >= top_p  # a top_p that rounds to 0 in float32 would drop every candidate:
        drop_BK[:, 0] = False  # the most likely one always stays (the limit top_p -> 0 is greedy)
        scores_BK = scores_BK.masked_fill(drop_BK, float("-inf"))
    index_B, logprob_B = _inverse_cdf(scores_BK, u_B)
    return ids_BK.gather(1, index_B.unsqueeze(1)).squeeze(1), logprob_B


def greedy_tokens(logits_BV: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The argmax token per row and its logprob under the model at temperature 1.

    A greedy policy puts all its mass on the argmax; the model's own logprob is the
    informative number (and what a trainer recomputes), so that is what is reported.
    """
    scores_BV = logits_BV.float()
    token_B = scores_BV.argmax(dim=-1)
    log_z_B = torch.logsumexp(scores_BV, dim=-1)
    return token_B, scores_BV.gather(1, token_B.unsqueeze(1)).squeeze(1) - log_z_B
