"""The numbers that compare a learned reward with the task's verifier: AUC (overall and within
prompt groups), rank and linear correlation, and the response-format classifier they are
broken down by. ``trinity-like rm-check`` reports them, the check at the start of an RL run
(:mod:`trinity_like.pipeline.reward_watch`) logs them, a workflow with a gold reward logs
their correlation at every step, and self-made pairs (:mod:`trinity_like.pipeline.self_pairs`)
are told apart by format with them; they live here, below all of those.

AUC here is the probability that a randomly drawn *right* response (by the task's
verifier) scores above a randomly drawn *wrong* one, ties counting one half (the
Mann-Whitney U statistic divided by the number of right-wrong pairs; Hanley & McNeil
1982). GRPO only ever compares responses to the *same* prompt (its advantage is the
reward minus the group's mean), so the number that predicts whether RL on the reward
model helps is the within-group AUC: the mean of per-prompt AUCs over prompts that have
both right and wrong samples. A reward model can rank "number vs text" perfectly across
prompts (a high overall AUC) and still be at chance within a group.

Example::

    auc([0.9, 0.1, 0.5], [True, False, True])          # 1.0
    grouped_auc([1, 0, 0, 1], [1, 0, 1, 0], ["a", "a", "b", "b"])  # (0.5, 2): a is 1.0, b is 0.0
"""

from __future__ import annotations

import math
import re
from collections.abc import Hashable, Sequence

FORMATS = ("number", "sentence", "other")
_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")
_WORD = re.compile(r"[A-Za-z]{2,}")


def response_format(text: str) -> str:
    """``number``: the stripped response is one number (``42``, ``-3``, ``1,234``, ``2.5``);
    ``sentence``: it holds a word of two or more letters and ends with ``.``, ``!`` or ``?``
    (``The answer is 42.``, ``No.``); ``other``: anything else (empty, cut off mid-sentence,
    symbols, a number with trailing text but no end mark).

    >>> [response_format(t) for t in ["42", " 1,234 ", "The answer is 42.", "Echo.", "", "42 + 1 =", "4 2"]]
    ['number', 'number', 'sentence', 'sentence', 'other', 'other', 'other']
    """
    stripped = text.strip()
    if _NUMBER.fullmatch(stripped):
        return "number"
    if _WORD.search(stripped) and stripped[-1:] in (".", "!", "?"):
        return "sentence"
    return "other"


def ranks(values: Sequence[float]) -> list[float]:
    """1-based ranks, tied values sharing the mean of their ranks.

    >>> ranks([10, 30, 20, 20])
    [1.0, 4.0, 2.5, 2.5]
    """
    order = sorted(range(len(values)), key=lambda i: values[i])
    out = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            out[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return out


def auc(scores: Sequence[float], positive: Sequence[bool]) -> float | None:
    """P(score of a positive > score of a negative) + 0.5 P(tie); None without both classes.

    Computed from ranks (Mann-Whitney U) in O(n log n).
    """
    if len(scores) != len(positive):
        raise ValueError(f"auc: {len(scores)} scores but {len(positive)} labels")
    n_pos = sum(bool(p) for p in positive)
    n_neg = len(positive) - n_pos
    if n_pos == 0 or n_neg == 0:
        return None
    r = ranks(scores)
    rank_sum = sum(ri for ri, p in zip(r, positive) if p)
    return (rank_sum - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg)


def grouped_auc(
    scores: Sequence[float], positive: Sequence[bool], groups: Sequence[Hashable]
) -> tuple[float | None, int]:
    """The mean of per-group AUCs over groups holding both classes, and how many such groups."""
    by_group: dict[Hashable, list[int]] = {}
    for i, g in enumerate(groups):
        by_group.setdefault(g, []).append(i)
    per_group = [auc([scores[i] for i in idx], [positive[i] for i in idx]) for idx in by_group.values()]
    kept = [a for a in per_group if a is not None]
    return (sum(kept) / len(kept) if kept else None), len(kept)


def pearson(x: Sequence[float], y: Sequence[float]) -> float | None:
    """Pearson's r; None for fewer than two points or a constant series."""
    n = len(x)
    if n != len(y):
        raise ValueError(f"pearson: {n} vs {len(y)} values")
    if n < 2:
        return None
    mx, my = sum(x) / n, sum(y) / n
    sxy = sum((a - mx) * (b - my) for a, b in zip(x, y))
    sxx = sum((a - mx) ** 2 for a in x)
    syy = sum((b - my) ** 2 for b in y)
    if sxx == 0 or syy == 0:
        return None
    return sxy / math.sqrt(sxx * syy)


def spearman(x: Sequence[float], y: Sequence[float]) -> float | None:
    """Spearman's rank correlation: Pearson's r of the (tie-averaged) ranks."""
    return pearson(ranks(x), ranks(y))


def fmt(value: float | None) -> str:
    """A statistic for a report line: three decimals, ``-`` when it is undefined (None)."""
    return "-" if value is None else f"{value:.3f}"
