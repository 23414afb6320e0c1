"""``trinity-like rm-check``: the AUC maths against independent oracles, and the whole check on
the tiny model with scorers whose answer is known by construction."""

from __future__ import annotations

import itertools
import json
import random

import pytest
import scipy.stats
import torch

from trinity_like.cli import main
from trinity_like.models.reward_model import RewardModel, save_reward_model
from trinity_like.models.tiny import build_tiny_model
from trinity_like.monitor.reward_stats import (
    auc,
    grouped_auc,
    pearson,
    response_format,
    spearman,
)


def pairwise_auc(scores, labels):
    """Oracle: every right-wrong pair counted by hand (O(n^2))."""
    pos = [s for s, y in zip(scores, labels) if y]
    neg = [s for s, y in zip(scores, labels) if not y]
    wins = sum(1.0 if p > n else 0.5 if p == n else 0.0 for p, n in itertools.product(pos, neg))
    return wins / (len(pos) * len(neg))


def test_auc_equals_the_pairwise_count_with_ties_and_correlations_equal_scipy():
    rng = random.Random(0)
    for _ in range(30):
        n = rng.randint(2, 40)
        scores = [rng.choice([0.0, 0.5, 1.0, rng.random()]) for _ in range(n)]  # many ties
        labels = [rng.random() < 0.4 for _ in range(n)]
        if all(labels) or not any(labels):
            assert auc(scores, labels) is None
            continue
        assert auc(scores, labels) == pytest.approx(pairwise_auc(scores, labels), abs=1e-12)
        lengths = [float(rng.randint(1, 9)) for _ in range(n)]
        if len(set(scores)) > 1 and len(set(lengths)) > 1:
            assert spearman(scores, lengths) == pytest.approx(
                scipy.stats.spearmanr(scores, lengths).statistic, abs=1e-9
            )
            assert pearson(scores, lengths) == pytest.approx(scipy.stats.pearsonr(scores, lengths).statistic, abs=1e-9)
    assert pearson([1.0, 1.0], [1.0, 2.0]) is None  # constant series: undefined, not 0


def test_within_group_auc_is_the_mean_over_groups_with_both_classes():
    # Right answers score higher than wrong ones across groups (overall AUC high), but within
    # each group the RM is backwards: the case the overall number hides.
    scores = [10, 9, 1, 0, 11, 12, 5]
    labels = [False, True, False, True, False, True, True]
    groups = ["a", "a", "b", "b", "c", "c", "d"]  # d has only a right sample: left out
    within, n = grouped_auc(scores, labels, groups)
    assert n == 3
    assert within == pytest.approx((0.0 + 0.0 + 1.0) / 3)
    assert auc(scores, labels) == pytest.approx(pairwise_auc(scores, labels))


@pytest.mark.parametrize(
    "text, want",
    [
        ("42", "number"),
        ("-7", "number"),
        ("The answer is 5.", "sentence"),
        ("No.", "sentence"),
        ("", "other"),
        ("5 apples", "other"),
        (".", "other"),
    ],
)
def test_response_format(text, want):
    assert response_format(text) == want


RECIPE = """
name: check_tiny
model:
  path: tiny-random
  max_response_tokens: 8
buffer:
  tasks:
    generator: arithmetic
  eval_tasks:
    generator: arithmetic
    split: eval
    size: 6
explorer:
  reward_fn: format
  reward_args: {pattern: '.*[0-9].*'}
  eval_reward_fn: format       # the "verifier": has a digit (the random model never adds right)
  eval_reward_args: {pattern: '.*[0-9].*'}
trainer:
  engine: local
"""


@pytest.fixture
def recipe(tmp_path):
    path = tmp_path / "recipe.yaml"
    path.write_text(RECIPE)
    return path


def test_a_scorer_equal_to_the_verifier_has_auc_one_everywhere(recipe, tmp_path, capsys):
    out = tmp_path / "check.json"
    assert (
        main(
            [
                "rm-check",
                "--tasks",
                str(recipe),
                "--samples",
                "6",
                "--reward-fn",
                "format",
                "--reward-args",
                "{pattern: '.*[0-9].*'}",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    report = json.loads(out.read_text())
    assert report["samples"] == 6 * 6 and 0 < report["right_frac"] < 1
    assert report["auc"]["overall"] == 1.0
    assert report["auc"]["groups_with_both"] > 0 and report["auc"]["within_group"] == 1.0
    # each sample's row agrees with the verifier it was scored by
    assert all(r["score"] == float(r["right"]) for r in report["rows"])
    assert sum(report["auc"]["by_format"][f]["n"] for f in ("number", "sentence", "other")) == 36
    assert report["probes"]["right_vs_off_by_one"] == {"rate": 0.5, "n": 6}  # both have a digit: a tie
    assert report["probes"]["right_vs_empty"] == {"rate": 1.0, "n": 6}
    assert report["warnings"] == []
    shown = capsys.readouterr().out
    assert "AUC within prompt  1.000" in shown and "warning" not in shown


def test_a_real_reward_model_that_scores_everything_alike_is_at_chance_and_warned(recipe, tmp_path, capsys):
    backbone, tok = build_tiny_model(seed=1)
    rm = RewardModel(backbone)
    torch.nn.init.zeros_(rm.head.weight)  # score = bias for every response: no preference at all
    torch.nn.init.constant_(rm.head.bias, 0.25)
    folder = save_reward_model(rm, tok, tmp_path / "rm")
    out = tmp_path / "check.json"
    assert main(["rm-check", str(folder), "--tasks", str(recipe), "--samples", "6", "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["auc"]["overall"] == 0.5 and report["auc"]["within_group"] == 0.5
    assert all(p["rate"] == 0.5 for p in report["probes"].values())
    assert report["length"]["spearman"] is None  # a constant score has no correlation
    assert len(report["warnings"]) == 1 and "chance" in report["warnings"][0]
    assert "warning: within-group AUC 0.500" in capsys.readouterr().out


def test_bad_arguments_are_one_line_errors(recipe, tmp_path, capsys):
    assert main(["rm-check", "--tasks", str(recipe)]) == 2
    assert "give a reward model (RM_RUN) or --reward-fn" in capsys.readouterr().err
    assert main(["rm-check", "--tasks", str(tmp_path / "nope.jsonl"), "--reward-fn", "format"]) == 2
    assert "no such file" in capsys.readouterr().err
    assert main(["rm-check", "--tasks", str(recipe), "--reward-fn", "format", "--reward-args", "[1"]) == 2
    assert "--reward-args" in capsys.readouterr().err


def test_the_verifier_is_not_rewritten_by_the_recipes_batch_transform(tmp_path):
    """A recipe that z-scores its trained reward: the check still reads the verifier's 0/1."""
    path = tmp_path / "recipe.yaml"
    path.write_text(RECIPE.replace("trainer:", "  workflow_args: {reward_transform: batch_normalize}\ntrainer:"))
    out = tmp_path / "check.json"
    assert (
        main(
            [
                "rm-check",
                "--tasks",
                str(path),
                "--samples",
                "6",
                "--reward-fn",
                "format",
                "--reward-args",
                "{pattern: '.*[0-9].*'}",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    report = json.loads(out.read_text())
    assert 0 < report["right_frac"] < 1 and report["auc"]["overall"] == 1.0
