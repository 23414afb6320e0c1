"""Token parity that survives fp32 near-ties: every token of a sample checked against a float64 oracle.

Why: fp32 on two devices (or fp32 against fp64) rounds differently, so where two candidates are
all but tied -- a greedy top-2 margin of 1e-7, a uniform that lands 1e-7 from a CDF boundary --
a correct engine may pick either; demanding identical tokens from CUDA and the CPU fails a correct
engine now and then (3 of 40 sampled calls flip between fp32 and fp64 on the CPU). Instead, at each
position of the sample, the float64 model recomputes the logits of the sample's own prefix and an
independent float64 inverse-CDF draws with the sample's own uniform (its seed, its draw index): the
sample's token must be that token, or one a measured epsilon away from it -- the fp32 logit error
of the same prefixes, times a margin. Past an accepted near-tie the check goes on along the
sample's own branch.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from trinity_like.explorer.sampling import seed_bits, uniforms

MARGIN = 8.0  # a near-tie: closer than this many times the measured fp32 error


@dataclass(frozen=True)
class Verdict:
    positions: int  # tokens checked
    near_ties: list[int]  # positions where the sample took the other side of a near-tie
    logprobs: list[float]  # float64 logprob of each checked token (temperature applied)
    mismatch: str | None  # the first position that is no near-tie (None: the sample agrees)


def logits64(model64, prompt: list[int], tokens: list[int]) -> torch.Tensor:
    """``[len(tokens), V]`` float64 logits that predicted each token (a full recompute, no cache)."""
    ids = torch.tensor([prompt + tokens[:-1]], device=model64.device)
    with torch.no_grad():
        out = model64(input_ids=ids, attention_mask=torch.ones_like(ids)).logits[0]
    return out[len(prompt) - 1 :].double().cpu()


def fp32_logit_error(model32, model64, prompts: list[list[int]], tokens: list[list[int]]) -> float:
    """The largest |fp32 - fp64| logit over the given prefixes: the scale of a near-tie (measured, not assumed)."""
    worst = 0.0
    for prompt, toks in zip(prompts, tokens):
        if toks:
            diff = (logits64(model32, prompt, toks) - logits64(model64, prompt, toks)).abs().max()
            worst = max(worst, float(diff))
    return worst


def check_sample(
    tokens: list[int], prompt: list[int], model64, *, greedy: bool, seed: int | None, temperature: float, error: float
) -> Verdict:
    """Each token of a sample against the float64 oracle; ``error``: :func:`fp32_logit_error`.

    Full-vocabulary sampling only (top-k 0, top-p 1): the engine's inverse CDF walks the
    vocabulary in id order, which is what the oracle does here.
    """
    if not tokens:
        return Verdict(0, [], None, [])
    logits_TV = logits64(model64, prompt, tokens)
    scale = 1.0 if greedy else temperature  # a greedy sample reports the model's own logprob
    logprobs = torch.log_softmax(logits_TV / scale, dim=-1).gather(1, torch.tensor(tokens)[:, None])[:, 0].tolist()
    ties: list[int] = []
    for i, (token, logits_V) in enumerate(zip(tokens, logits_TV)):
        if greedy:
            best = int(logits_V.argmax())
            gap = float(logits_V[best] - logits_V[token])
            if token == best:
                continue
            if gap <= MARGIN * 2 * error:  # both logits may be off by `error`, in opposite directions
                ties.append(i)
                continue
            return Verdict(
                i + 1, ties, logprobs[: i + 1], f"position {i}: greedy {token} trails the argmax {best} by {gap:.3e}"
            )
        assert seed is not None
        u = float(uniforms(torch.tensor([seed_bits(seed)]), torch.tensor([i]))[0])
        probs_V = torch.softmax(logits_V / temperature, dim=-1)
        cdf_V = probs_V.cumsum(0)
        want = int(
            torch.searchsorted(cdf_V, torch.tensor([u], dtype=torch.float64), right=True).clamp(max=len(cdf_V) - 1)
        )
        if token == want:
            continue
        # The token's own CDF interval, and how far u lies outside it. A logit error e moves every
        # boundary by at most ~2e / temperature (softmax's sensitivity); fp32's cumsum adds ~V ulps.
        lo = float(cdf_V[token - 1]) if token > 0 else 0.0
        hi = float(cdf_V[token])
        outside = max(lo - u, u - hi, 0.0)
        slack = MARGIN * (2 * error / temperature + len(cdf_V) * torch.finfo(torch.float32).eps)
        if outside <= slack:
            ties.append(i)
            continue
        return Verdict(
            i + 1,
            ties,
            logprobs[: i + 1],
            f"position {i}: drew {token}, the oracle {want}; u {u:.6f} is {outside:.3e} from it",
        )
    return Verdict(len(tokens), ties, logprobs, None)
