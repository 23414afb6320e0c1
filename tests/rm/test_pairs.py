"""Preference pairs of every kind the policy produces (``kind_pairs``, ``trinity-like rm-pairs``)."""

from __future__ import annotations

import json
import re

from trinity_like.cli import main
from trinity_like.experience import Experience, Task
from trinity_like.monitor.reward_stats import response_format
from trinity_like.pipeline.self_pairs import PAIR_KINDS, kind_pairs

TASK = Task(prompt="What is 2 + 3?", answer="5")


def sample(text: str, right: bool, finish: str = "stop") -> Experience:
    return Experience(
        tokens=[1], prompt_length=1, reward=float(right), finish_reason=finish, info={"response_text": text}
    )


def test_one_pair_per_kind_from_the_policys_own_right_and_wrong_answers():
    samples = [
        sample("6", False),
        sample("The answer is 5.", True),
        sample("The answer is 4.", False),
        sample("6", False),
        sample("4", False),
        sample("The answer is 6.", False),
        sample("The answer is 6.", False),
        sample("Echo.", False),
        sample("", False),
        sample("5 5 5", False, "length"),
        sample(" 5", True),
    ]
    got = {p["kind"]: (p["chosen"], p["rejected"]) for p in kind_pairs(TASK, samples)}
    assert got == {
        "number": ("5", "6"),  # "6" twice beats "4"
        "sentence": ("The answer is 5.", "The answer is 6."),
        "number_over_sentence": ("5", "The answer is 6."),
        "sentence_over_number": ("The answer is 5.", "6"),
        "right_over_other": ("The answer is 5.", ""),  # the first right answer sampled; "" ended, "5 5 5" was cut
    }
    # No right bare number sampled: the reference answer stands in; no right sentence: no sentence pair.
    got = {
        p["kind"]: (p["chosen"], p["rejected"]) for p in kind_pairs(TASK, [sample("7", False), sample("No.", False)])
    }
    assert got == {"number": ("5", "7"), "number_over_sentence": ("5", "No.")}
    assert kind_pairs(TASK, [sample("5", True)]) == []  # nothing wrong: nothing to prefer over
    assert all(p["prompt"] == TASK.messages() for p in kind_pairs(TASK, samples))


RECIPE = """
name: pairs_tiny
model:
  path: tiny-random
  max_response_tokens: 8
buffer:
  tasks:
    generator: arithmetic
  eval_tasks:
    generator: arithmetic
    split: eval
explorer:
  reward_fn: format
  reward_args: {pattern: '.*[0-9].*'}
  eval_reward_fn: format       # the "verifier": has a digit (the random model never adds right)
  eval_reward_args: {pattern: '.*[0-9].*'}
trainer:
  engine: local
"""

RM = """
name: rm_on_policy_pairs
mode: train
model: {path: tiny-random}
algorithm: {type: rm}
buffer:
  train_data: {path: pairs/pairs.jsonl}
  eval_data: {path: pairs/pairs_eval.jsonl, shuffle: false}
  train_batch_size: 4
trainer: {engine: local, total_steps: 2, micro_batch_size: 8}
monitor: {progress: false}
"""


def test_rm_pairs_writes_train_and_held_out_files_a_reward_model_trains_on(tmp_path, capsys):
    (tmp_path / "recipe.yaml").write_text(RECIPE)
    out = tmp_path / "pairs"
    assert (
        main(
            [
                "rm-pairs",
                str(tmp_path / "recipe.yaml"),
                "--out",
                str(out),
                "--samples",
                "6",
                "--num-tasks",
                "12",
                "--num-eval-tasks",
                "6",
            ]
        )
        == 0
    )
    summary = json.loads((out / "pairs.json").read_text())
    for key, name, n in (("tasks", "pairs.jsonl", 12), ("eval_tasks", "pairs_eval.jsonl", 6)):
        pairs = [json.loads(line) for line in (out / name).read_text().splitlines()]
        assert summary[key]["tasks"] == n and summary[key]["samples"] == 6 * n
        assert summary[key]["pairs"] == len(pairs) > 0
        assert summary[key]["by_kind"] == {k: sum(p["kind"] == k for p in pairs) for k in summary[key]["by_kind"]}
        for p in pairs:
            good, bad = PAIR_KINDS[p["kind"]]
            assert bad == response_format(p["rejected"]) and good in (None, response_format(p["chosen"]))
            assert not re.fullmatch(".*[0-9].*", p["rejected"], re.DOTALL)  # wrong under the verifier
    assert "pairs_eval.jsonl" in capsys.readouterr().out
    (tmp_path / "rm.yaml").write_text(RM)
    assert main(["run", "--config", str(tmp_path / "rm.yaml"), f"run_root={tmp_path / 'runs'}"]) == 0
