"""Several challengers against one baseline: their p-values on one metric are adjusted together
(Holm), and train rewards from different reward functions are not compared."""

from __future__ import annotations

from trinity_like.compare.report import _paired_block, correct_for_family, rewarded_differently
from trinity_like.compare.stats import holm

BASE = {0: 0.50, 1: 0.55, 2: 0.60}


def block(label: str, deltas: list[float]) -> dict:
    other = {s: v + d for (s, v), d in zip(BASE.items(), deltas)}
    return _paired_block("grpo", label, BASE, other, "accuracy at the end", 100.0, " points", 1, True)


def test_a_verdict_that_does_not_survive_the_family_says_so_and_keeps_what_it_says_alone():
    comparisons = {
        "strong": [block("strong", [0.10, 0.11, 0.12])],  # p ~ 0.001 alone
        "weak": [block("weak", [0.03, 0.06, 0.04])],  # p ~ 0.04 alone: "better" on its own
        "none": [block("none", [0.01, -0.02, 0.005])],
    }
    alone = {label: blocks[0]["p"] for label, blocks in comparisons.items()}
    assert alone["weak"] < 0.05 and comparisons["weak"][0]["verdict"] == "weak better"
    correct_for_family(comparisons)
    want = dict(zip(alone, holm(list(alone.values()))))
    for label, (b,) in comparisons.items():
        assert b["p_holm"] == want[label] and b["family"] == 3 and b["p"] == alone[label]
        assert ", Holm p" in b["line"] and "over 3 comparisons" in b["line"]
    assert comparisons["strong"][0]["verdict"] == "strong better"
    weak = comparisons["weak"][0]
    assert weak["verdict"] == "no difference shown after correcting for 3 comparisons"
    assert weak["verdict_alone"] == "weak better" and weak["line"].endswith("(alone: weak better)")
    assert comparisons["none"][0]["verdict"] == "no difference shown"


def test_one_challenger_is_left_as_it_is():
    comparisons = {"weak": [block("weak", [0.03, 0.06, 0.04])]}
    before = dict(comparisons["weak"][0])
    correct_for_family(comparisons)
    assert comparisons["weak"][0] == before


def test_train_rewards_of_different_reward_functions_are_not_compared():
    diff = [
        ("explorer.reward_fn", {"grpo": "exact_match", "dapo": "exact_match", "grpo_with_rm": "reward_model"}),
        ("algorithm.type", {"grpo": "grpo", "dapo": "dapo", "grpo_with_rm": "grpo"}),
    ]
    assert rewarded_differently(diff, "grpo", "grpo_with_rm")
    assert not rewarded_differently(diff, "grpo", "dapo")
    staged = [("[rl] explorer.reward_args", {"a": {"path": "rm1"}, "b": {"path": "rm2"}})]
    assert rewarded_differently(staged, "a", "b")
