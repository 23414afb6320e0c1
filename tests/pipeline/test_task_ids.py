"""Every task has its own id: a task source that leaves `task_id` empty (the plugin guide's
`count`) gets `<source>-<split>-<seed>-<index>`, so each held-out row of `evals.jsonl` is its
own task's prompt and answer -- not one task's for all, as a dict keyed by an empty id made them."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from trinity_like.buffer.task_sources import with_task_ids
from trinity_like.config import load_plan
from trinity_like.errors import ConfigError, TrinityError
from trinity_like.experience import Experience, Task
from trinity_like.models.tiny import build_tiny_tokenizer
from trinity_like.monitor.evals import answer_items
from trinity_like.runner import run_plan

REPO = Path(__file__).resolve().parents[2]
GUIDE = REPO / "plugins" / "README.md"


def guide_count_source() -> str:
    """The plugin guide's task source block, verbatim: its tasks have no task_id."""
    blocks = re.findall(r"^```python\n(.*?)^```", GUIDE.read_text(), flags=re.S | re.M)
    (block,) = [b for b in blocks if '@TASK_SOURCE.register_module("count")' in b]
    assert "task_id" not in block
    return block


def test_held_out_rows_of_a_source_without_ids_are_each_their_own_task(tmp_path):
    plugin = tmp_path / "count_source.py"
    plugin.write_text(guide_count_source())
    overrides = [
        f"run_root={tmp_path}",
        f"plugins=[{plugin}]",
        "model.path=tiny-random",
        "trainer.engine=local",
        "trainer.total_steps=1",
        "explorer.batch_size=2",
        "explorer.group_size=2",
        "monitor.progress=false",
        "buffer.tasks={generator: count, generator_args: {upto: 20}}",
        "buffer.eval_tasks={generator: count, generator_args: {upto: 5}, split: eval}",
    ]
    plan = load_plan(REPO / "examples" / "grpo_arith.yaml", overrides)
    assert run_plan(plan) == 0
    run_dir = Path(plan.stages[0].config.run_dir())
    items = [json.loads(line) for line in (run_dir / "evals.jsonl").read_text().splitlines()]
    for step in (0, 1):
        rows = sorted((r for r in items if r["step"] == step), key=lambda r: r["task_id"])
        assert [r["task_id"] for r in rows] == [f"count-eval-0-{n}" for n in range(5)]
        # each row its own task: "What comes after n?" with n + 1 -- five distinct prompts, not one
        assert [(r["prompt"], r["answer"]) for r in rows] == [(f"What comes after {n}?", str(n + 1)) for n in range(5)]


def test_ids_are_derived_where_missing_kept_where_given_and_stable():
    tasks = [Task("a"), Task("b", task_id="given"), Task("c")]
    first = with_task_ids(tasks, generator="count:x", split="train", seed=3, where="buffer.tasks")
    again = with_task_ids(tasks, generator="count:x", split="train", seed=3, where="buffer.tasks")
    assert [t.task_id for t in first] == ["count-train-3-0", "given", "count-train-3-2"] == [t.task_id for t in again]
    assert [t.task_id for t in tasks] == ["", "given", ""]  # the source's own objects are left as they were


def test_a_source_giving_two_tasks_one_id_is_an_error_naming_it():
    with pytest.raises(ConfigError, match=r"^buffer\.eval_tasks\.generator: task source 'count' gave tasks 1 and 2"):
        with_task_ids(
            [Task("a"), Task("b", task_id="x"), Task("c", task_id="x")],
            generator="count",
            split="eval",
            seed=0,
            where="buffer.eval_tasks",
        )
    with pytest.raises(ConfigError, match=r"task source 'count' gave a str, not a Task"):
        with_task_ids(["What is 1 + 1?"], generator="count", split="eval", seed=0, where="buffer.eval_tasks")


def test_answer_items_refuse_held_out_tasks_that_share_an_id():
    tok = build_tiny_tokenizer()
    tasks = [Task("What is 1 + 1?", "2"), Task("What is 2 + 2?", "4")]  # no ids: both ""
    row = Experience(tokens=[1, 2, 3], prompt_length=2, reward=1.0)
    with pytest.raises(TrinityError, match="held-out tasks share the task id ''"):
        answer_items(tasks, [row], tok)


def test_docstring_examples():
    import doctest

    import trinity_like.buffer.task_sources

    result = doctest.testmod(trinity_like.buffer.task_sources, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0
