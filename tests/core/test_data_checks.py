"""`validate` / `--dry-run` read the first rows of every data file and refuse what the run refuses
(trinity_like/config/data_checks.py); held-out sources inherit the training source's system
prompt; `monitor.eval_interval: 0` means never; `datasets` folders and `load_tasks`."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from trinity_like.buffer.datasets import DatasetOptions, TaskSet, load_tasks
from trinity_like.config import describe_plan, load_plan
from trinity_like.errors import ConfigError, DataError
from trinity_like.pipeline.data_sources import load_stage_data

GSM = Path(__file__).resolve().parents[2] / "examples" / "gsm8k_style.yaml"


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def recipe(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "recipe.yaml"
    path.write_text(textwrap.dedent(body))
    return path


@pytest.mark.parametrize(
    "algo, key, rows, message",
    [
        (
            "grpo",
            "tasks",
            [{"question": "q", "answer": "1"}],
            r'tasks\.jsonl:1: missing field "prompt"; set buffer\.tasks\.prompt_key to the field that holds it '
            r'\(this row\'s fields: "question", "answer"\)$',
        ),
        (
            "grpo",
            "tasks",
            [{"prompt": "q", "answer": "1"}, {"prompt": "q", "answer": " "}],
            r'tasks\.jsonl:2: field "answer" is empty \(buffer\.tasks\.answer_key names it; this row\'s fields: '
            r'"prompt", "answer"\)$',
        ),
        (
            "sft",
            "train_data",
            [{"prompt": "q", "reply": "a"}],
            r'train_data\.jsonl:1: missing field "response"; set buffer\.train_data\.response_key',
        ),
        (
            "dpo",
            "train_data",
            [{"prompt": "q", "chosen": "a", "worse": "b"}],
            r'train_data\.jsonl:1: missing field "rejected"; set buffer\.train_data\.rejected_key .*"worse"\)$',
        ),
    ],
)
def test_validate_refuses_what_the_run_refuses_naming_the_key_and_the_fields(tmp_path, algo, key, rows, message):
    write_jsonl(tmp_path / f"{key}.jsonl", rows)
    online = "tasks:\n    generator: arithmetic\n  " if key != "tasks" and algo == "grpo" else ""
    path = recipe(
        tmp_path,
        f"""\
        algorithm:
          type: {algo}
        trainer:
          engine: local
        buffer:
          {online}{key}:
            path: {key}.jsonl
        """,
    )
    with pytest.raises(ConfigError, match=rf"^{path}:\d+: buffer\.{key}: " + message):
        load_plan(path)


def test_a_bad_row_past_the_first_ones_is_refused_by_the_run_with_the_same_hint(tmp_path):
    rows = [{"question": f"q{i}", "answer": str(i)} for i in range(30)] + [{"question": "q", "answer": ""}]
    write_jsonl(tmp_path / "tasks.jsonl", rows)
    path = recipe(tmp_path, "buffer:\n  tasks:\n    path: tasks.jsonl\n    prompt_key: question\n")
    spec = load_plan(path, ["trainer.engine=local"]).stages[0]  # the first 20 rows are fine
    with pytest.raises(
        DataError,
        match=r'^tasks\.jsonl:31: field "answer" is empty \(buffer\.tasks\.answer_key names it; this row\'s fields: '
        r'"question", "answer"\)$',
    ):
        load_stage_data(spec, "both", tokenizer=None)


def test_parquet_and_saved_datasets_are_read_and_checked_like_jsonl(tmp_path):
    import datasets

    rows = [{"question": f"What is {i} + 1?", "answer": f"...\n#### {i + 1}"} for i in range(5)]
    source = write_jsonl(tmp_path / "t.jsonl", rows)
    datasets.Dataset.from_list(rows).to_parquet(str(tmp_path / "t.parquet"))
    datasets.Dataset.from_list(rows).save_to_disk(str(tmp_path / "saved"))
    datasets.DatasetDict({"train": datasets.Dataset.from_list(rows)}).save_to_disk(str(tmp_path / "dict"))
    expected = [(t.prompt, t.answer) for t in load_tasks(str(source), prompt_key="question")]
    for name, where in (("t.parquet", "t.parquet:row 0"), ("saved", "saved:row 0")):
        tasks = load_tasks(str(tmp_path / name), prompt_key="question")
        assert [(t.prompt, t.answer) for t in tasks] == expected and tasks[0].task_id == where
        with pytest.raises(DataError, match=rf'^{where}: missing field "prompt"'):
            load_tasks(str(tmp_path / name))
        path = recipe(tmp_path, f"buffer:\n  tasks:\n    path: {name}\n")
        with pytest.raises(ConfigError, match=rf'buffer\.tasks: {where}: missing field "prompt"; set buffer\.tasks'):
            load_plan(path)
    with pytest.raises(
        DataError, match=r"a DatasetDict saved with save_to_disk; point at one split's folder \(train\)"
    ):
        TaskSet(DatasetOptions(path=str(tmp_path / "dict")))
    assert load_tasks(str(source), prompt_key="question", size=2, system_prompt="S")[1].messages() == [
        {"role": "system", "content": "S"},
        {"role": "user", "content": "What is 1 + 1?"},
    ]


def test_held_out_sources_inherit_the_training_system_prompt_and_a_difference_is_shown():
    spec = load_plan(GSM, ["trainer.engine=local"]).stages[0]
    data = load_stage_data(spec, "both", tokenizer=None)
    system = spec.config.buffer.tasks.system_prompt
    assert system and all(t.system_prompt == system for t in data.eval_tasks)
    assert "system_prompt: from buffer.tasks" in describe_plan(load_plan(GSM))
    own = load_plan(GSM, ["buffer.eval_tasks.system_prompt=Be brief."])
    assert "warning: system_prompt differs from buffer.tasks's" in describe_plan(own)
    data = load_stage_data(own.stages[0], "both", tokenizer=None)
    assert {t.system_prompt for t in data.eval_tasks} == {"Be brief."}


def test_eval_interval_zero_means_never_at_both_doors():
    plan = load_plan(GSM, ["monitor.eval_interval=0"])
    assert "held-out evaluation never (monitor.eval_interval: 0; leave it unset" in describe_plan(plan)
    assert load_stage_data(plan.stages[0], "both", tokenizer=None).eval_tasks is None
    assert "held-out evaluation at the start and at the end" in describe_plan(
        load_plan(GSM, ["monitor.eval_interval=null"])
    )
    with pytest.raises(
        ConfigError, match=r"monitor\.eval_interval: 0 means never evaluate .* monitor\.rm_check_tasks reads"
    ):
        load_plan(GSM, ["monitor.eval_interval=0", "monitor.rm_check_tasks=4"])


def test_the_plan_names_the_train_engine_it_will_use():
    local = describe_plan(load_plan(GSM))
    assert "trainer: local (in-process torch in this process; no Ray, no verl workers)" in local
    assert "verl workers on CPU" not in local
    verl = describe_plan(load_plan(GSM, ["trainer.engine=verl"]))
    assert "trainer: verl (1 FSDP worker(s) on CPU over gloo, through a Ray started here)" in verl
