"""Means with Student-t intervals over seeds, paired differences, and the verdict they support.

Seeds are few (3 to 10), so intervals are Student t, not normal: with 3 seeds the 95 %
interval is ``mean +- 4.30 * sd / sqrt(3)``. Two recipes run with the same seeds (the same
training tasks in the same order, the same sampling seeds) are compared *paired*: the
difference ``B - A`` is taken seed by seed and its mean tested against 0 (paired t-test),
which removes what the seeds share (an easy draw of training tasks helps both). A verdict
says only what the interval supports: "B better" when the whole interval lies on the better
side, "B worse" on the other, else "no difference shown" -- never "no difference", which
a handful of seeds cannot show.

Several challengers against one baseline are several tests: at 5 % each, one of seven shows
a difference by chance about a third of the time. Their p-values on one metric are therefore
adjusted together (:func:`holm`, Holm's step-down: the chance that *any* verdict of the family
is a false "better" or "worse" stays at most 5 %), and a verdict stands only where the
adjusted p does; with one challenger nothing changes.

    >>> s = summarize([0.5, 0.6, 0.7])
    >>> round(s.mean, 3), round(s.low, 3), round(s.high, 3)
    (0.6, 0.352, 0.848)
    >>> d = paired([0.50, 0.55, 0.60], [0.60, 0.70, 0.71])
    >>> round(d.mean, 3), d.n
    (0.12, 3)
    >>> holm([0.01, 0.04, 0.03])
    [0.03, 0.06, 0.06]
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass

CONFIDENCE = 0.95


@dataclass(frozen=True)
class Summary:
    """Mean of ``n`` values with its ``CONFIDENCE`` Student-t interval (``low``, ``high``: None below 2 values)."""

    n: int
    mean: float
    sd: float  # sample standard deviation (ddof 1); 0 for one value
    low: float | None
    high: float | None

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class Paired(Summary):
    """Mean of the per-seed differences ``b - a``, its interval, and the paired t-test's two-sided p-value."""

    p: float | None = None  # None: fewer than 2 pairs, or every pair differs by the same amount (no spread to test)


def summarize(values: Sequence[float], confidence: float = CONFIDENCE) -> Summary:
    """Mean and Student-t interval of ``values`` (``scipy.stats.t.interval``; equal values have a
    zero-width interval, where scipy would answer NaN for a zero scale)."""
    from scipy import stats

    n = len(values)
    if n == 0:
        raise ValueError("summarize: no values")
    mean = math.fsum(values) / n
    if n == 1:
        return Summary(1, mean, 0.0, None, None)
    sd = math.sqrt(math.fsum((v - mean) ** 2 for v in values) / (n - 1))
    if sd == 0:
        return Summary(n, mean, sd, mean, mean)
    low, high = stats.t.interval(confidence, n - 1, loc=mean, scale=sd / math.sqrt(n))
    return Summary(n, mean, sd, float(low), float(high))


def paired(a: Sequence[float], b: Sequence[float], confidence: float = CONFIDENCE) -> Paired:
    """``b - a`` paired by position (seed): mean, interval and the paired t-test's two-sided p-value
    (``scipy.stats.ttest_rel``; None where the differences do not vary, and the test has nothing to
    divide by)."""
    from scipy import stats

    if len(a) != len(b):
        raise ValueError(f"paired: {len(a)} values against {len(b)}")
    diffs = [y - x for x, y in zip(a, b)]
    s = summarize(diffs, confidence)
    p = float(stats.ttest_rel(b, a).pvalue) if s.n >= 2 and s.sd > 0 else None
    return Paired(s.n, s.mean, s.sd, s.low, s.high, p)


def holm(ps: Sequence[float]) -> list[float]:
    """Holm-adjusted p-values, in the order given: the i-th smallest of m times (m - i + 1),
    made non-decreasing in that order and capped at 1. (``scipy.stats.false_discovery_control``
    offers only Benjamini-Hochberg and -Yekutieli, which bound the share of false findings, not
    the chance of any; statsmodels' ``multipletests`` would be a large dependency for these lines.)"""
    m = len(ps)
    order = sorted(range(m), key=lambda i: ps[i])
    out = [0.0] * m
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * ps[i]))
        out[i] = running
    return out


def verdict(d: Paired, *, higher_is_better: bool = True, name_a: str = "A", name_b: str = "B") -> str:
    """What the interval of ``b - a`` supports, in a few words: ``"B better"``, ``"B worse"``, ``"no difference shown"``."""
    if d.n < 2:
        return f"{d.n} paired seed{'s' if d.n != 1 else ''}: no interval, no verdict (run --seeds 2 or more)"
    if d.sd == 0:
        if d.mean == 0:
            return "no difference shown (equal on every seed)"
        low = high = d.mean  # the same difference on every seed: no spread, the sign is all there is
    else:
        low, high = d.low, d.high
    if low > 0 or high < 0:
        better = (low > 0) == higher_is_better
        return f"{name_b} {'better' if better else 'worse'}"
    return "no difference shown"


def fmt_number(x: float | None, scale: float = 1.0, digits: int = 1, sign: bool = False) -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "-"
    return f"{x * scale:{'+' if sign else ''}.{digits}f}"


def fmt_p(p: float | None) -> str:
    if p is None:
        return "p = -"
    return "p < 0.001" if p < 0.001 else f"p = {p:.3f}" if p < 0.1 else f"p = {p:.2f}"


def verdict_line(
    d: Paired,
    *,
    what: str,
    name_a: str,
    name_b: str,
    scale: float = 1.0,
    unit: str = "",
    digits: int = 1,
    higher_is_better: bool = True,
) -> str:
    """One line: ``"dr_grpo - grpo = +7.5 points [+2.1, +12.9], p = 0.02, 3 seeds: dr_grpo better"``."""
    value = fmt_number(d.mean, scale, digits, sign=True)
    interval = (
        f" [{fmt_number(d.low, scale, digits, sign=True)}, {fmt_number(d.high, scale, digits, sign=True)}]"
        if d.low is not None
        else ""
    )
    seeds = f"{d.n} seed{'s' if d.n != 1 else ''}"
    says = verdict(d, higher_is_better=higher_is_better, name_a=name_a, name_b=name_b)
    return f"{what}: {name_b} - {name_a} = {value}{unit}{interval}, {fmt_p(d.p)}, {seeds}: {says}"
