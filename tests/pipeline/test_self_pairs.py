"""Preference pairs from the model's own wrong answers (``pairs_from_samples``)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from trinity_like.config import load_plan
from trinity_like.config.engine_params import explorer_params
from trinity_like.errors import ConfigError, TrinityError
from trinity_like.experience import Experience, Task
from trinity_like.explorer.worker import ExplorerWorker
from trinity_like.pipeline.data_sources import source_tasks
from trinity_like.pipeline.self_pairs import _pair, build_self_pairs
from trinity_like.registry import REWARD_FN
from trinity_like.runner import run_plan

REPO = Path(__file__).resolve().parents[2]
RECIPE = REPO / "examples" / "dpo_self_pairs.yaml"
TINY = [
    "model.path=tiny-random",
    "trainer.engine=local",
    "monitor.progress=false",
    "checkpoint.interval=1",
    "buffer.train_data.size=8",
    "buffer.train_data.pairs_from_samples=4",
    "buffer.eval_data.size=4",
    "buffer.eval_tasks.size=4",
    "buffer.train_batch_size=4",
    "trainer.total_steps=2",
    # the random model never answers a sum right: call "has a digit" right, so some samples are
    "explorer.reward_fn=format",
    "explorer.reward_args={pattern: '.*[0-9].*'}",
]


def sample(text: str, reward: float, finish: str = "stop") -> Experience:
    return Experience(tokens=[1, 2], prompt_length=1, reward=reward, finish_reason=finish, info={"response_text": text})


def test_pair_is_the_answer_vs_the_most_frequent_wrong_response_that_ended_on_its_own():
    task = Task(prompt="What is 2 + 2?", answer="4", system_prompt="Be brief.")
    samples = [
        sample("5", 0.0),
        sample(" 3 ", 0.0),
        sample("4", 1.0),
        sample("3", 0.0),
        sample("7 7 7 7", 0.0, "length"),
        sample("7 7 7 7", 0.0, "length"),
        sample("7 7 7 7", 0.0, "length"),
    ]
    assert _pair(task, samples) == {
        "prompt": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2 + 2?"}],
        "chosen": "4",
        "rejected": "3",  # "3" twice; the cut-off "7 7 7 7" counts only when nothing ended
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
    assert summary["pairs"] == len(pairs) > 0 and summary["skipped"] == 0
    assert summary["pairs"] + summary["all_right"] == 8  # each task: a pair, or every sample right
    for p in pairs:
        assert p["chosen"] in tasks and p["prompt"][-1]["role"] == "user"
        assert not re.fullmatch(".*[0-9].*", p["rejected"], re.S)  # wrong under the run's reward
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert rows[0]["self_pairs/train_data/pairs"] == len(pairs) and "self_pairs/eval_data/pairs" in rows[0]
    assert [r["step"] for r in rows if "loss" in r] == [1, 2]

    before = {f.name: (f.read_bytes(), f.stat().st_mtime_ns) for f in folder.iterdir()}
    ref_cache = (run_dir / "ref_cache.safetensors").stat().st_mtime_ns  # all 8 train pairs seen in 2 steps of 4
    run(tmp_path, "trainer.total_steps=3")  # resumes at step 2 on the same pairs
    assert {f.name: (f.read_bytes(), f.stat().st_mtime_ns) for f in folder.iterdir()} == before
    assert (run_dir / "ref_cache.safetensors").stat().st_mtime_ns == ref_cache  # every reference logprob was a hit
    assert not (run_dir / "sync").exists()  # an offline stage never publishes weights
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "loss" in r] == [1, 2, 3]


@REWARD_FN.register_module("test_self_pairs_raises", force=True)
def always_raises(*, response: str) -> float:
    raise ValueError("this reward always fails")


def stage_and_tasks(tmp_path: Path, *extra: str):
    stage = load_plan(RECIPE, [f"run_root={tmp_path}", *TINY, *extra]).stages[0]
    source = stage.config.buffer.train_data
    return stage, source, source_tasks(source, "buffer.train_data")


def test_pairs_on_disk_are_rebuilt_only_when_what_they_depend_on_changes(tmp_path):
    stage, source, tasks = stage_and_tasks(tmp_path)
    made = []

    def explorer():
        made.append(ExplorerWorker(explorer_params(stage.config), "tiny-random"))
        return made[-1]

    def build(src, resuming=False, stage=stage):
        return build_self_pairs(stage, src, "buffer.train_data", tasks, tmp_path, explorer, resuming=resuming)

    first = build(source)
    assert first[2] and len(made) == 1
    assert build(source) == (first[0], first[1], False) and len(made) == 1  # read back, no model
    assert build(source.model_copy(update={"shuffle": False}))[1] == first[1] and len(made) == 1  # order only
    with pytest.raises(
        TrinityError,
        match=r"buffer\.train_data\.pairs_from_samples: .* has checkpoints trained on "
        r"pairs built with other settings \(changed: samples\)",
    ):
        build(source.model_copy(update={"pairs_from_samples": 2}), resuming=True)
    _, summary, built = build(source.model_copy(update={"pairs_from_samples": 2}))
    assert built and len(made) == 2 and summary["samples"] == 8 * 2
    (tmp_path / "train_data.jsonl").unlink()
    with pytest.raises(TrinityError, match=r"has checkpoints but its pairs .* are gone"):
        build(source, resuming=True)


def test_right_and_wrong_follow_the_eval_reward_and_no_pair_is_a_clear_error(tmp_path):
    # every response matches ".*": always right by the evaluation reward, whatever the training reward says
    stage, source, tasks = stage_and_tasks(
        tmp_path, "explorer.eval_reward_fn=format", "explorer.eval_reward_args={pattern: '.*'}"
    )
    with pytest.raises(
        TrinityError,
        match=r"buffer\.train_data\.pairs_from_samples: no pair from 8 tasks x 4 samples "
        r"\(8 always answered right, 0 skipped\)",
    ):
        build_self_pairs(
            stage,
            source,
            "buffer.train_data",
            tasks,
            tmp_path,
            lambda: ExplorerWorker(explorer_params(stage.config), "tiny-random"),
            resuming=False,
        )
    stage, source, tasks = stage_and_tasks(
        tmp_path, "explorer.eval_reward_fn=test_self_pairs_raises", "explorer.reward_retries=0"
    )
    with pytest.raises(
        TrinityError, match=r"\(0 always answered right, 8 skipped; first reward failure: .*always fails"
    ):
        build_self_pairs(
            stage,
            source,
            "buffer.train_data",
            tasks,
            tmp_path,
            lambda: ExplorerWorker(explorer_params(stage.config), "tiny-random"),
            resuming=False,
        )
    assert not (tmp_path / "train_data.jsonl").exists()


def test_a_reward_model_trains_on_pairs_from_samples(tmp_path):
    plan = load_plan(
        REPO / "examples" / "rm_tiny.yaml",
        [
            f"run_root={tmp_path}",
            "model.path=tiny-random",
            "trainer.engine=local",
            "trainer.total_steps=2",
            "monitor.progress=false",
            "buffer.train_data={generator: arithmetic, size: 6, pairs_from_samples: 2}",
        ],
    )
    assert run_plan(plan) == 0
    rows = [
        json.loads(line) for line in (Path(plan.stages[0].config.run_dir()) / "metrics.jsonl").read_text().splitlines()
    ]
    assert rows[0]["self_pairs/train_data/pairs"] == 6 and [r["step"] for r in rows if "loss" in r] == [1, 2]


@pytest.mark.parametrize("recipe, key", [("sft.yaml", "train_data"), ("grpo_arith.yaml", "tasks")])
def test_pairs_from_samples_outside_pair_data_is_a_config_error(recipe, key):
    with pytest.raises(ConfigError, match=rf"buffer\.{key}\.pairs_from_samples: builds preference pairs"):
        load_plan(REPO / "examples" / recipe, [f"buffer.{key}.pairs_from_samples=4"])
