"""Preference pairs from the model's own wrong answers (``pairs_from_samples``)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from trinity_like.config import load_plan
from trinity_like.errors import ConfigError
from trinity_like.experience import Experience, Task
from trinity_like.pipeline.self_pairs import _pair, build_self_pairs, source_tasks
from trinity_like.runner import run_plan

REPO = Path(__file__).resolve().parents[2]
RECIPE = REPO / "examples" / "dpo_self_pairs.yaml"
TINY = [
    "model.path=tiny-random", "trainer.engine=local", "monitor.progress=false", "checkpoint.interval=1",
    "buffer.train_data.size=8", "buffer.train_data.pairs_from_samples=4", "buffer.eval_data.size=4",
    "buffer.eval_tasks.size=4", "buffer.train_batch_size=4", "trainer.total_steps=2",
    # the random model never answers a sum right: call "has a digit" right, so some samples are
    "explorer.reward_fn=format", "explorer.reward_args={pattern: '.*[0-9].*'}", "explorer.eval_reward_fn=exact_match",
]


def sample(text: str, reward: float, finish: str = "stop") -> Experience:
    return Experience(tokens=[1, 2], prompt_length=1, reward=reward, finish_reason=finish, info={"response_text": text})


def test_pair_is_the_answer_vs_the_most_frequent_wrong_response_that_ended_on_its_own():
    task = Task(prompt="What is 2 + 2?", answer="4", system_prompt="Be brief.")
    samples = [sample("5", 0.0), sample(" 3 ", 0.0), sample("4", 1.0), sample("3", 0.0),
               sample("7 7 7 7", 0.0, "length"), sample("7 7 7 7", 0.0, "length"), sample("7 7 7 7", 0.0, "length")]
    assert _pair(task, samples) == {
        "prompt": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2 + 2?"}],
        "chosen": "4", "rejected": "3",  # "3" twice; the cut-off "7 7 7 7" counts only when nothing ended
    }
    assert _pair(task, [sample("1", 0.0), sample("2", 0.0)])["rejected"] == "1"  # a tie: the first sampled
    assert _pair(task, [sample("7 7", 0.0, "length")])["rejected"] == "7 7"
    assert _pair(task, [sample("4", 1.0), sample("4", 1.0)]) is None


def run(tmp_path: Path, *extra: str) -> Path:
    plan = load_plan(RECIPE, [f"run_root={tmp_path}", *TINY, *extra])
    assert run_plan(plan) == 0
    return Path(plan.stages[0].config.run_dir())


def test_dpo_trains_on_pairs_of_the_models_own_wrong_answers_and_a_resume_reuses_them(tmp_path):
    run_dir = run(tmp_path)
    folder = run_dir / "self_pairs"
    pairs = [json.loads(line) for line in (folder / "train_data.jsonl").read_text().splitlines()]
    summary = json.loads((folder / "train_data.json").read_text())["summary"]
    tasks = {t.answer for t in source_tasks(load_plan(RECIPE, TINY).stages[0].config.buffer.train_data, "t")}
    assert summary["tasks"] == 8 and summary["samples"] == 8 * 4
    assert summary["pairs"] == len(pairs) > 0 and summary["pairs"] + summary["all_right"] + summary["skipped"] == 8
    for p in pairs:
        assert p["chosen"] in tasks and p["prompt"][-1]["role"] == "user"
        assert not re.fullmatch(".*[0-9].*", p["rejected"], re.S)  # wrong under the run's reward
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert rows[0]["self_pairs/train_data/pairs"] == len(pairs) and "self_pairs/eval_data/pairs" in rows[0]
    assert [r["step"] for r in rows if "loss" in r] == [1, 2]

    before = {f.name: (f.read_bytes(), f.stat().st_mtime_ns) for f in folder.iterdir()}
    run(tmp_path, "trainer.total_steps=3")  # resumes at step 2 on the same pairs
    assert {f.name: (f.read_bytes(), f.stat().st_mtime_ns) for f in folder.iterdir()} == before
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "loss" in r] == [1, 2, 3]


def test_pairs_on_disk_are_rebuilt_only_when_their_source_changes(tmp_path):
    stage = load_plan(RECIPE, [f"run_root={tmp_path}", *TINY]).stages[0]
    source = stage.config.buffer.train_data
    tasks = source_tasks(source, "buffer.train_data")
    from trinity_like.pipeline.explorer_actor import ExplorerWorker

    made = []

    def explorer():
        made.append(ExplorerWorker(stage.config, "tiny-random"))
        return made[-1]

    first = build_self_pairs(stage, source, "buffer.train_data", tasks, tmp_path, explorer)
    assert build_self_pairs(stage, source, "buffer.train_data", tasks, tmp_path, explorer) == first
    assert len(made) == 1  # the second call read the pairs back without a model
    more = source.model_copy(update={"pairs_from_samples": 2})
    _, summary = build_self_pairs(stage, more, "buffer.train_data", tasks, tmp_path, explorer)
    assert len(made) == 2 and summary["samples"] == 8 * 2


@pytest.mark.parametrize("recipe, key", [("sft.yaml", "train_data"), ("grpo_arith.yaml", "tasks")])
def test_pairs_from_samples_outside_pair_data_is_a_config_error(recipe, key):
    with pytest.raises(ConfigError, match=rf"buffer\.{key}\.pairs_from_samples: builds preference pairs"):
        load_plan(REPO / "examples" / recipe, [f"buffer.{key}.pairs_from_samples=4"])
