"""Intervals, paired tests and verdicts against hand computations (t tables, the closed-form t CDF for integer degrees of freedom)."""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from trinity_like.compare.stats import holm, paired, summarize, verdict, verdict_line

T975 = {1: 12.706204736174698, 2: 4.302652729749464, 4: 2.7764451051977934}  # two-sided 95 % t quantiles (tables)


def t2_two_sided_p(t: float) -> float:
    """Two-sided p of Student t with 2 degrees of freedom: its CDF is 1/2 + t / (2 sqrt(2 + t^2))."""
    return 1.0 - abs(t) / math.sqrt(2.0 + t * t)


def test_mean_and_interval_of_three_seeds():
    s = summarize([0.55, 0.60, 0.71])
    mean = (0.55 + 0.60 + 0.71) / 3
    sd = math.sqrt(((0.55 - mean) ** 2 + (0.60 - mean) ** 2 + (0.71 - mean) ** 2) / 2)
    half = T975[2] * sd / math.sqrt(3)
    assert s.n == 3 and s.mean == pytest.approx(mean) and s.sd == pytest.approx(sd)
    assert s.low == pytest.approx(mean - half) and s.high == pytest.approx(mean + half)


def test_five_seeds_use_four_degrees_of_freedom():
    values = [1.0, 2.0, 3.0, 4.0, 5.0]  # mean 3, sd sqrt(2.5)
    s = summarize(values)
    assert s.high - s.mean == pytest.approx(T975[4] * math.sqrt(2.5) / math.sqrt(5))


def test_one_seed_has_no_interval():
    s = summarize([0.4])
    assert (s.n, s.mean, s.low, s.high) == (1, 0.4, None, None)
    with pytest.raises(ValueError):
        summarize([])


def test_paired_difference_interval_and_p_value():
    a = [0.50, 0.40, 0.30]
    b = [0.51, 0.42, 0.33]  # differences 0.01, 0.02, 0.03: mean 0.02, sd 0.01
    d = paired(a, b)
    se = 0.01 / math.sqrt(3)
    assert d.n == 3 and d.mean == pytest.approx(0.02) and d.sd == pytest.approx(0.01)
    assert d.low == pytest.approx(0.02 - T975[2] * se) and d.high == pytest.approx(0.02 + T975[2] * se)
    assert d.p == pytest.approx(t2_two_sided_p(0.02 / se))  # t = 3.46: p = 0.074
    assert verdict(d) == "no difference shown"  # the interval [-0.005, 0.045] holds 0


def test_pairing_removes_what_seeds_share():
    """Seeds that differ a lot from one another but where B beats A by the same small margin on each:
    unpaired the spread hides it; paired, the margin shows."""
    a = [0.20, 0.50, 0.80]
    b = [0.25, 0.56, 0.84]
    d = paired(a, b)
    assert d.low > 0 and verdict(d, name_b="B") == "B better"
    assert summarize(b).low < summarize(a).mean  # the unpaired intervals overlap widely
    assert d.p == pytest.approx(t2_two_sided_p(d.mean / (d.sd / math.sqrt(3))))


def test_verdict_follows_the_direction_of_better():
    d = paired([1.0, 1.0, 1.0], [0.7, 0.8, 0.75])  # B lower on every seed, with spread
    assert d.high < 0
    assert verdict(d, higher_is_better=True, name_b="B") == "B worse"
    assert verdict(d, higher_is_better=False, name_b="B") == "B better"  # a loss: lower is better


def test_verdicts_without_spread_or_seeds():
    assert verdict(paired([0.5, 0.6], [0.5, 0.6])) == "no difference shown (equal on every seed)"
    same = paired([0.5, 0.6], [0.6, 0.7])  # +0.1 on both seeds: no spread, no test, the sign stands
    assert same.p is None and verdict(same, name_b="B") == "B better"
    one = paired([0.5], [0.9])
    assert one.low is None and "no verdict" in verdict(one)
    with pytest.raises(ValueError):
        paired([0.1, 0.2], [0.1])


def test_the_verdict_line_reads_as_the_issue_asks():
    a = [0.550, 0.520, 0.600]
    b = [0.610, 0.600, 0.685]  # +6, +8, +8.5 points
    d = paired(a, b)
    line = verdict_line(d, what="held-out accuracy", name_a="A", name_b="B", scale=100, unit=" points")
    low, high = (d.low * 100, d.high * 100)
    assert line == (
        f"held-out accuracy: B - A = +7.5 points [{low:+.1f}, {high:+.1f}], p = {d.p:.3f}, 3 seeds: B better"
    )
    assert low > 0 and d.p < 0.05


def test_holm_adjusts_a_textbook_family():
    # sorted: 0.005 x 4 = 0.02, 0.01 x 3 = 0.03, 0.03 x 2 = 0.06, 0.04 x 1 -> 0.06 (never below the one before)
    assert holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert holm([0.2]) == [0.2] and holm([0.6, 0.9]) == [1.0, 1.0]


@given(st.lists(st.floats(0.0, 1.0), min_size=1, max_size=12), st.sampled_from([0.01, 0.05, 0.1]))
def test_holm_rejects_what_the_step_down_procedure_rejects(ps, alpha):
    """Holm's procedure as first written: sort, reject while p_(k) <= alpha / (m - k), stop at the first that is not."""
    m = len(ps)
    rejected = set()
    for k, i in enumerate(sorted(range(m), key=lambda i: ps[i])):
        if ps[i] > alpha / (m - k):
            break
        rejected.add(i)
    adjusted = holm(ps)
    assert {i for i in range(m) if adjusted[i] <= alpha} == rejected
    assert all(p <= a <= 1.0 for p, a in zip(ps, adjusted))


def t_central(t: float, nu: int) -> float:
    """P(|T| < t) for Student t with an integer ``nu`` degrees of freedom, in closed form
    (Abramowitz & Stegun 26.7.3 and 26.7.4: a finite series in cos(theta), theta = atan(t / sqrt(nu)))."""
    theta = math.atan(abs(t) / math.sqrt(nu))
    c2, term, total = math.cos(theta) ** 2, 1.0, 1.0
    if nu % 2 == 0:  # sin(theta) (1 + 1/2 c^2 + 1*3/(2*4) c^4 + ... up to c^(nu-2))
        for k in range(1, nu // 2):
            term *= c2 * (2 * k - 1) / (2 * k)
            total += term
        return math.sin(theta) * total
    if nu == 1:
        return 2 * theta / math.pi
    for k in range(1, (nu - 1) // 2):  # (2/pi) (theta + sin cos (1 + 2/3 c^2 + ... up to c^(nu-3)))
        term *= c2 * (2 * k) / (2 * k + 1)
        total += term
    return 2 / math.pi * (theta + math.sin(theta) * math.cos(theta) * total)


def t_quantile_975(nu: int) -> float:
    """The t with P(|T| < t) = 0.95, by bisection on :func:`t_central`."""
    low, high = 0.0, 100.0
    for _ in range(200):
        mid = (low + high) / 2
        low, high = (mid, high) if t_central(mid, nu) < 0.95 else (low, mid)
    return (low + high) / 2


def test_the_closed_form_oracle_matches_the_tables():
    assert all(t_quantile_975(nu) == pytest.approx(q, rel=1e-12) for nu, q in T975.items())
    assert 1 - t_central(1.7, 2) == pytest.approx(t2_two_sided_p(1.7), rel=1e-13)


def test_interval_and_p_value_agree_with_the_closed_form_t_distribution_on_random_samples():
    # stats.py asks scipy.stats (t.interval, ttest_rel); the oracle is the series above, not scipy
    rng = random.Random(0)
    for _ in range(200):
        n = rng.randint(2, 12)
        a = [rng.gauss(0, 1) for _ in range(n)]
        b = [x + rng.gauss(0.3, 1) for x in a]
        d = paired(a, b)
        diffs = [y - x for x, y in zip(a, b)]
        mean = math.fsum(diffs) / n
        sd = math.sqrt(math.fsum((v - mean) ** 2 for v in diffs) / (n - 1))
        assert d.p == pytest.approx(1 - t_central(mean / (sd / math.sqrt(n)), n - 1), rel=1e-9, abs=1e-15)
        s = summarize(a)
        half = t_quantile_975(n - 1) * s.sd / math.sqrt(n)
        assert s.high - s.mean == pytest.approx(half, rel=1e-9)
        assert s.mean - s.low == pytest.approx(half, rel=1e-9)
