"""The divergence rule of RewardHackingGuard, against hand-worked sequences."""

from __future__ import annotations

import numpy as np
import pytest

from trinity_like.monitor.reward_hacking import RewardHackingGuard, learned_mean, slope


def test_slope_is_the_least_squares_fit():
    rng = np.random.default_rng(0)
    for n in (2, 3, 5, 9):
        y = rng.normal(size=n)
        assert slope(list(y)) == pytest.approx(np.polyfit(np.arange(n), y, 1)[0])


def run(pairs, window=2):
    guard = RewardHackingGuard(window=window, stop=False)
    return guard, [guard.observe(s, version=s - 1, gold=g, learned=r) for s, (g, r) in enumerate(pairs, start=1)]


def test_gold_falling_while_learned_rises_over_the_window():
    _, v = run([(0.5, 1.0), (0.6, 1.1), (0.4, 1.3), (0.3, 1.6), (0.35, 1.7), (0.5, 1.8)])
    # by hand, the window of K + 1 = 3 gold means (the learned reward rises throughout):
    # step 3: 0.5, 0.6, 0.4 -- slope (0.4 - 0.5) / 2 < 0 and ends below 0.5: diverging
    # step 4: 0.6, 0.4, 0.3 -- diverging; step 5: 0.4, 0.3, 0.35 -- slope < 0, ends below 0.4: diverging
    # step 6: 0.3, 0.35, 0.5 -- rising again
    assert [x.diverging for x in v] == [False, False, True, True, True, False]
    assert "fell over the last 2 steps (0.6 at step 2 -> 0.3)" in v[3].message and "(1.1 -> 1.6)" in v[3].message
    assert [x.new_best for x in v] == [True, True, False, False, False, False]


def test_both_rising_or_both_falling_is_not_divergence():
    _, v = run([(0.1, 1.0), (0.2, 1.2), (0.3, 1.5), (0.4, 1.9)])
    assert not any(x.diverging for x in v)
    _, v = run([(0.4, 1.9), (0.3, 1.5), (0.2, 1.2), (0.1, 1.0)])  # a collapse of both: not hacking
    assert not any(x.diverging for x in v)
    _, v = run([(0.4, 1.0), (0.2, 1.5), (0.45, 1.6)])  # a dip that recovers above its start
    assert not v[-1].diverging


def test_the_raw_learned_reward_is_watched_when_a_transform_rewrote_it():
    assert learned_mean({"reward/mean": 0.0, "reward/raw_mean": 3.0}) == 3.0
    assert learned_mean({"reward/mean": 1.0}) == 1.0
    assert learned_mean({"reward/gold_mean": 1.0}) is None
