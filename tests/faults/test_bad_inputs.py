"""Bad input through the front door: `trinity-like run --config ...` as a user types it.

Each case breaks one thing -- the recipe (YAML or TOML), an override, a plugin, or a
tasks / SFT / pairs data file -- and asserts the whole contract: exit status 2, exactly
one line on stderr, in the exact shape ``trinity-like: error: <file>:<line>: <key>: <what>``
(or ``<data file>:<line>: <what>``), and no run directory created. The unit tests of each
part (tests/core/test_config.py, tests/buffer/test_datasets.py, tests/core/test_plugins.py)
test the messages one level down; this table is what the user sees.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from trinity_like.buffer.datasets import DatasetOptions, TaskSet
from trinity_like.cli import main
from trinity_like.plugins import ENV_VAR

GRPO = """\
name: bad
model:
  path: tiny-random
algorithm:
  type: grpo
  kl_loss:
    name: none
buffer:
  tasks:
    path: data.jsonl
trainer:
  engine: local
  total_steps: 1
monitor:
  progress: false
  eval_at_start: false
"""

GRPO_TOML = """\
name = "bad"

[model]
path = "tiny-random"

[algorithm]
type = "grpo"

[buffer.tasks]
path = "data.jsonl"

[trainer]
engine = "local"
total_steps = 1
"""

OFFLINE = """\
name: bad
mode: train
model:
  path: tiny-random
algorithm:
  type: {algo}
buffer:
  train_data:
    path: data.jsonl
trainer:
  engine: local
  total_steps: 1
monitor:
  progress: false
  eval_at_start: false
"""
SFT, DPO = OFFLINE.format(algo="sft"), OFFLINE.format(algo="dpo")

TASK = {"prompt": "What is 2 + 2?", "answer": "4"}
CHAT = {"messages": [{"role": "user", "content": "What is 2 + 2?"}, {"role": "assistant", "content": "4"}]}
PAIR = {"prompt": "What is 2 + 2?", "chosen": "4", "rejected": "5"}


# A bad row among the first ones is refused by `validate` / `run` before anything loads, at the
# recipe line of its data source (trinity_like/config/data_checks.py); a missing or empty field
# also names the key that maps it and the row's fields (checked word for word in
# tests/core/test_data_checks.py).
ROW = r"r\.yaml:\d+: buffer\.\w+: "
HINT = r"(?: \(buffer\.\w+\.\w+ names it; this row's fields: .*\)|; set buffer\.\w+\.\w+ to the field that holds it \(this row's fields: .*\)| \(this row's fields: .*\))?"


def jsonl(*rows: object) -> bytes:
    return "".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows).encode()


@dataclass(frozen=True)
class Case:
    """One bad input: the files of a fresh folder, the command's extra arguments, the message."""

    id: str
    expect: str  # regex of the message after "trinity-like: error: "; {dir} is the case's folder
    recipe: str | bytes = GRPO  # text of r.yaml (or of `recipe_name`)
    data: bytes = jsonl(TASK, TASK)  # data.jsonl
    args: tuple[str, ...] = ()  # after `run --config <recipe>`
    recipe_name: str = "r.yaml"
    files: dict[str, bytes] = field(default_factory=dict)  # more files of the folder


PLUGIN_DUP = b"""
from trinity_like.components import AlgorithmType
from trinity_like.registry import ALGORITHM_TYPE

ALGORITHM_TYPE.register_module("grpo", module=AlgorithmType(description="mine", policy_loss="ppo"))
"""

CASES = [
    # -- recipes: YAML ------------------------------------------------------------------
    Case(
        "yaml_syntax",
        r"r\.yaml:4: bad YAML: expected ',' or ']', but got '<stream end>'",
        recipe="name: bad\nmodel:\n  path: [tiny\n",
    ),
    Case("yaml_duplicate_section", r"r\.yaml:17: trainer: duplicate key", recipe=GRPO + "trainer:\n  total_steps: 2\n"),
    Case(
        "yaml_unknown_key",
        r"r\.yaml:13: trainer\.totl_steps: unknown key; did you mean 'total_steps'\?",
        recipe=GRPO.replace("total_steps: 1", "totl_steps: 1"),
    ),
    Case(
        "yaml_wrong_type",
        r"r\.yaml:13: trainer\.total_steps: Input should be a valid integer \(got 'one'\)",
        recipe=GRPO.replace("total_steps: 1", "total_steps: one"),
    ),
    Case(
        "yaml_out_of_range",
        r"r\.yaml:13: trainer\.total_steps: Input should be greater than 0 \(got 0\)",
        recipe=GRPO.replace("total_steps: 1", "total_steps: 0"),
    ),
    Case("yaml_not_a_mapping", r"r\.yaml:1: a recipe must be a mapping of sections, got list", recipe="- a\n- b\n"),
    Case(
        "yaml_unknown_algorithm",
        r"r\.yaml:5: algorithm\.type: unknown algorithm type 'grpoo'; did you mean 'grpo'\? \(registered: .*\)",
        recipe=GRPO.replace("type: grpo", "type: grpoo"),
    ),
    Case(
        "yaml_unknown_reward_fn",
        r"r\.yaml:18: explorer\.reward_fn: unknown reward function 'exact_matsh'; did you mean 'exact_match'\? \(registered: .*\)",
        recipe=GRPO + "explorer:\n  reward_fn: exact_matsh\n",
    ),
    # cluster keys mean what they say: no `nnodes` (a node count is the Ray cluster's, not the
    # recipe's), and GPU workers on a machine without GPUs stop at once instead of Ray waiting for them
    Case(
        "yaml_cluster_nnodes",
        r"r\.yaml:18: cluster\.nnodes: unknown key \(known: device, ray_address, num_cpus, num_gpus, .*\)",
        recipe=GRPO + "cluster:\n  nnodes: 2\n",
    ),
    Case(
        "override_cluster_num_gpus_without_gpus",
        r"cluster\.num_gpus: 64 GPUs asked for the verl workers, but this "
        r"machine has \d+ usable by torch; set cluster\.num_gpus: 0 to train on CPU",
        args=("trainer.engine=verl", "cluster.trainer_workers=64", "cluster.num_gpus=64"),
    ),
    Case(
        "yaml_path_and_generator",
        r"r\.yaml:9: buffer\.tasks: .*set exactly one of `path` and `generator` .*",
        recipe=GRPO.replace("    path: data.jsonl", "    path: data.jsonl\n    generator: arithmetic"),
    ),
    Case(
        "yaml_missing_data_file",
        r"r\.yaml:10: buffer\.tasks\.path: no_such_file\.jsonl: no such data file or folder "
        r"\(looked in the recipe's folder {dir} and the working directory {dir}\)",
        recipe=GRPO.replace("path: data.jsonl", "path: no_such_file.jsonl"),
    ),
    Case(
        "yaml_data_folder_without_data",
        r"r\.yaml:10: buffer\.tasks\.path: .*empty_dir: expected \.jsonl or \.parquet data files",
        recipe=GRPO.replace("path: data.jsonl", "path: empty_dir"),
        files={"empty_dir/notes.txt": b"x"},
    ),
    Case(
        "yaml_data_file_not_jsonl",
        r"r\.yaml:10: buffer\.tasks\.path: .*data\.csv: expected \.jsonl or \.parquet data files",
        recipe=GRPO.replace("path: data.jsonl", "path: data.csv"),
        files={"data.csv": b"prompt,answer\n"},
    ),
    Case(
        "yaml_unknown_model",
        r"r\.yaml:3: model\.path: model 'no_such_model' not found: .* does not exist, and it is not a built-in id \(.*\); nothing is downloaded",
        recipe=GRPO.replace("path: tiny-random", "path: no_such_model"),
    ),
    Case(
        "yaml_duplicate_stage_names",
        r"r\.yaml:\d+: stages\.1\.name: duplicate stage name 'a'",
        recipe=GRPO + "stages:\n  - name: a\n  - name: a\n",
    ),
    Case(
        "yaml_not_utf8",
        r"r\.yaml: cannot be read: 'utf-8' codec can't decode byte 0xe9.*",
        recipe="name: caf\xe9\n".encode("latin-1"),
    ),
    Case("recipe_missing", r"no_such\.yaml: no such recipe file", args=("--config", "no_such.yaml")),
    Case(
        "recipe_wrong_suffix",
        r"r\.txt: unknown recipe format '\.txt' \(use \.yaml, \.yml or \.toml\)",
        recipe_name="r.txt",
    ),
    # YAML that expands without bound or names what a safe loader refuses: aliases are bounded
    # (tests/faults/test_hostile_recipes.py runs the FIFO, /dev/zero and "billion laughs" cases)
    Case(
        "yaml_self_alias",
        r"r\.yaml:18: alias \*t is inside the node &t it names \(a recursive alias\)",
        recipe=GRPO + "explorer: &t\n  x: *t\n",
    ),
    Case(
        "yaml_aliases_expand_too_far",
        r"r\.yaml:\d+: alias \*c: aliases expand to more than 10000 nodes in all .*",
        recipe=GRPO
        + "x: &a [1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1]\n"
        + "y: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a, *a, *a, *a, *a, *a, *a, *a, *a, *a, *a, *a]\n"
        + "z: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b, *b, *b, *b, *b, *b, *b, *b, *b, *b, *b, *b]\n"
        + "w: [*c, *c]\n",
    ),
    Case(
        "yaml_too_deep",
        r"r\.yaml:17: nested deeper than 100 levels",
        recipe=GRPO + "x: " + "[" * 200 + "]" * 200 + "\n",
    ),
    Case(
        "yaml_python_tag",
        r"r\.yaml:17: bad YAML: tag 'tag:yaml\.org,2002:python/object/apply:os\.system' is not allowed in a recipe",
        recipe=GRPO + "x: !!python/object/apply:os.system [echo hi]\n",
    ),
    Case(
        "yaml_bad_int_tag",
        r"r\.yaml:13: bad YAML: invalid literal for int\(\) with base 10: 'one'",
        recipe=GRPO.replace("total_steps: 1", "total_steps: !!int one"),
    ),
    Case(
        "yaml_list_as_key",
        r"r\.yaml:17: a key must be a plain value, not a list or mapping",
        recipe=GRPO + "? [a, b]\n: 1\n",
    ),
    Case(
        "override_recursive_alias",
        r"override 'trainer\.total_steps=&x \[\*x\]': alias \*x is inside the node &x it names \(a recursive alias\)",
        args=("trainer.total_steps=&x [*x]",),
    ),
    # -- recipes: TOML ------------------------------------------------------------------
    Case(
        "toml_syntax",
        r"r\.toml: bad TOML: .*\(at line 3, column \d+\)",
        recipe='name = "bad"\n[model]\npath = \n',
        recipe_name="r.toml",
    ),
    Case(
        "toml_unknown_key",
        r"r\.toml:14: trainer\.totl_steps: unknown key; did you mean 'total_steps'\?",
        recipe=GRPO_TOML.replace("total_steps = 1", "totl_steps = 1"),
        recipe_name="r.toml",
    ),
    Case(
        "toml_wrong_type",
        r"r\.toml:14: trainer\.total_steps: Input should be a valid integer \(got '1'\)",
        recipe=GRPO_TOML.replace("total_steps = 1", 'total_steps = "1"'),
        recipe_name="r.toml",
    ),
    Case(
        "toml_missing_data_file",
        r"r\.toml:10: buffer\.tasks\.path: gone\.jsonl: no such data file or folder .*",
        recipe=GRPO_TOML.replace('path = "data.jsonl"', 'path = "gone.jsonl"'),
        recipe_name="r.toml",
    ),
    Case(
        "toml_too_deep",
        r"r\.toml: bad TOML: nested too deeply",
        recipe=GRPO_TOML + "x = " + "[" * 20000 + "]" * 20000 + "\n",
        recipe_name="r.toml",
    ),
    Case(
        "toml_duplicate_key",
        r"r\.toml: bad TOML: .*\(at line 15, column \d+\)",
        recipe=GRPO_TOML + "total_steps = 2\n",
        recipe_name="r.toml",
    ),
    # -- overrides ----------------------------------------------------------------------
    Case(
        "override_without_equals",
        r"override 'trainer\.total_steps': expected key\.path=value",
        args=("trainer.total_steps",),
    ),
    Case(
        "override_unknown_key",
        r"r\.yaml: override 'trainer\.totl_steps=3': trainer\.totl_steps: unknown key; did you mean 'total_steps'\?",
        args=("trainer.totl_steps=3",),
    ),
    Case(
        "override_wrong_type",
        r"r\.yaml: override 'trainer\.total_steps=many': trainer\.total_steps: Input should be a valid integer \(got 'many'\)",
        args=("trainer.total_steps=many",),
    ),
    Case(
        "override_into_a_value",
        r"override 'trainer\.total_steps\.x=1': trainer\.total_steps is not a section",
        args=("trainer.total_steps.x=1",),
    ),
    Case(
        "override_missing_data_file",
        r"r\.yaml: override 'buffer\.tasks\.path=nope\.jsonl': buffer\.tasks\.path: nope\.jsonl: no such data file or folder .*",
        args=("buffer.tasks.path=nope.jsonl",),
    ),
    # -- plugins ------------------------------------------------------------------------
    Case(
        "plugin_module_missing",
        r"r\.yaml:\d+: plugin 'no_such_plugin_mod' not found: no module 'no_such_plugin_mod' on sys\.path .*",
        recipe=GRPO + "plugins:\n  - no_such_plugin_mod\n",
    ),
    Case(
        "plugin_file_missing",
        r"r\.yaml:\d+: plugin '{dir}/gone\.py': no such module, \.py file or package folder",
        recipe=GRPO + "plugins:\n  - ./gone.py\n",
    ),
    Case(
        "plugin_raises",
        r"r\.yaml:\d+: plugin '{dir}/broken_raises\.py' failed to import: ZeroDivisionError: division by zero at {dir}/broken_raises\.py:2",
        recipe=GRPO + "plugins:\n  - ./broken_raises.py\n",
        files={"broken_raises.py": b"x = 1\ny = 1 / 0\n"},
    ),
    Case(
        "plugin_syntax_error",
        r"r\.yaml:\d+: plugin '{dir}/broken_syntax\.py' failed to import: SyntaxError: .*",
        recipe=GRPO + "plugins:\n  - ./broken_syntax.py\n",
        files={"broken_syntax.py": b"def f(:\n"},
    ),
    Case(
        "plugin_duplicate_name",
        r"r\.yaml:\d+: plugin '{dir}/dup_plugin\.py' failed to import: .*'grpo' is already registered by "
        r"algorithms\..*; registered again by .*\({dir}/dup_plugin\.py:5\): give one of them another name.*",
        recipe=GRPO + "plugins:\n  - ./dup_plugin.py\n",
        files={"dup_plugin.py": PLUGIN_DUP},
    ),
    Case(
        "plugin_flag_missing",
        r"--plugin: plugin 'no_such_flag_plugin' not found: .*",
        args=("--plugin", "no_such_flag_plugin"),
    ),
    # -- task files -----------------------------------------------------------------------
    Case(
        "tasks_empty_prompt",
        ROW + r'data\.jsonl:2: field "prompt" is empty' + HINT,
        data=jsonl(TASK, {**TASK, "prompt": ""}),
    ),
    Case(
        "tasks_blank_prompt",
        ROW + r'data\.jsonl:1: field "prompt" is empty' + HINT,
        data=jsonl({**TASK, "prompt": " \n\t"}),
    ),
    Case(
        "tasks_empty_answer",
        ROW + r'data\.jsonl:2: field "answer" is empty' + HINT,
        data=jsonl(TASK, {**TASK, "answer": ""}),
    ),
    Case(
        "tasks_blank_chat_prompt",
        ROW + r'data\.jsonl:1: field "prompt" is empty \(every message is blank\)' + HINT,
        data=jsonl({**TASK, "prompt": [{"role": "user", "content": "  "}]}),
    ),
    Case(
        "tasks_missing_answer", ROW + r'data\.jsonl:2: missing field "answer"' + HINT, data=jsonl(TASK, {"prompt": "x"})
    ),
    Case(
        "tasks_null_prompt", ROW + r'data\.jsonl:1: missing field "prompt"' + HINT, data=jsonl({**TASK, "prompt": None})
    ),
    Case(
        "tasks_latin1",
        ROW + r"data\.jsonl:2: not UTF-8 text \(invalid continuation byte\)" + HINT,
        data=jsonl(TASK) + '{"prompt": "caf\xe9 2 + 2", "answer": "4"}\n'.encode("latin-1"),
    ),
    Case(
        "tasks_binary",
        ROW + r"data\.jsonl:1: not UTF-8 text \(invalid start byte\)" + HINT,
        data=b"\x89PNG\r\n\x1a\n\x00\x00\xff\xfe",
    ),
    Case(
        "tasks_truncated_last_line",
        ROW + r"data\.jsonl:3: invalid JSON \(Unterminated string starting at at column \d+\)" + HINT,
        data=jsonl(TASK, TASK) + b'{"prompt": "What is',
    ),
    Case(
        "tasks_nan_answer",
        ROW + r"data\.jsonl:2: invalid JSON \(NaN is not a JSON number\)" + HINT,
        data=jsonl(TASK, '{"prompt": "p", "answer": NaN}'),
    ),
    Case(
        "tasks_infinity_in_extra_field",
        ROW + r"data\.jsonl:1: invalid JSON \(-Infinity is not a JSON number\)" + HINT,
        data=jsonl('{"prompt": "p", "answer": "1", "weight": -Infinity}'),
    ),
    Case(
        "tasks_nested_prompt",
        ROW + r'data\.jsonl:1: field "prompt" must be a string or a list, got a dict' + HINT,
        data=jsonl({**TASK, "prompt": {"text": "What is 2 + 2?"}}),
    ),
    Case(
        "tasks_duplicate_key",
        ROW + r'data\.jsonl:2: duplicate key "answer" in one JSON object' + HINT,
        data=jsonl(TASK, '{"prompt": "p", "answer": "1", "answer": "2"}'),
    ),
    Case(
        "tasks_duplicate_nested_key",
        ROW + r'data\.jsonl:1: duplicate key "role" in one JSON object' + HINT,
        data=jsonl('{"prompt": [{"role": "user", "role": "system", "content": "x"}], "answer": "1"}'),
    ),
    Case(
        "tasks_row_not_an_object",
        ROW + r"data\.jsonl:2: expected a JSON object, got list" + HINT,
        data=jsonl(TASK, [1, 2]),
    ),
    Case(
        "tasks_boolean_answer",
        ROW + r'data\.jsonl:1: field "answer" must be a string or a number, got a boolean' + HINT,
        data=jsonl({**TASK, "answer": True}),
    ),
    Case(
        "tasks_kind_changes",
        ROW + r'data\.jsonl:3: field "answer" is a number here but a string at data\.jsonl:1' + HINT,
        data=jsonl(TASK, TASK, {**TASK, "answer": 4}),
    ),
    Case("tasks_only_blank_lines", r"data\.jsonl: the data set is empty", data=b"\n  \r\n\n"),
    # -- SFT files (chat form and prompt/response) ------------------------------------
    Case(
        "sft_no_assistant",
        ROW + r'data\.jsonl:1: field "messages" has no assistant message to train on' + HINT,
        recipe=SFT,
        data=jsonl({"messages": [{"role": "user", "content": "hi"}]}),
    ),
    Case(
        "sft_empty_assistant",
        ROW + r'data\.jsonl:2: field "messages": every assistant message is empty' + HINT,
        recipe=SFT,
        data=jsonl(CHAT, {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": ""}]}),
    ),
    Case(
        "sft_message_without_content",
        ROW + r'data\.jsonl:1: field "messages" message 1 must have a string "role" and "content"' + HINT,
        recipe=SFT,
        data=jsonl({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant"}]}),
    ),
    Case(
        "sft_messages_not_a_list",
        ROW + r'data\.jsonl:1: field "messages" must be a list, got a string' + HINT,
        recipe=SFT,
        data=jsonl({"messages": "hi"}),
    ),
    Case(
        "sft_empty_response",
        ROW + r'data\.jsonl:1: field "response" is empty' + HINT,
        recipe=SFT,
        data=jsonl({"prompt": "hi", "response": ""}),
    ),
    Case(
        "sft_crlf_truncated",
        ROW + r"data\.jsonl:2: invalid JSON \(Expecting ',' delimiter at column \d+\)" + HINT,
        recipe=SFT,
        data=json.dumps(CHAT).encode() + b"\r\n" + json.dumps(CHAT).encode()[:-3],
    ),
    # -- preference pairs -----------------------------------------------------------------
    Case(
        "pairs_missing_rejected",
        ROW + r'data\.jsonl:2: missing field "rejected"' + HINT,
        recipe=DPO,
        data=jsonl(PAIR, {"prompt": "p", "chosen": "c"}),
    ),
    Case(
        "pairs_empty_chosen",
        ROW + r'data\.jsonl:1: field "chosen" is empty' + HINT,
        recipe=DPO,
        data=jsonl({**PAIR, "chosen": ""}),
    ),
    Case(
        "pairs_number_response",
        ROW + r'data\.jsonl:1: field "rejected" must be a string, got a number' + HINT,
        recipe=DPO,
        data=jsonl({**PAIR, "rejected": 5}),
    ),
    Case(
        "pairs_nan",
        ROW + r"data\.jsonl:1: invalid JSON \(NaN is not a JSON number\)" + HINT,
        recipe=DPO,
        data=jsonl('{"prompt": "p", "chosen": "c", "rejected": "r", "margin": NaN}'),
    ),
    Case("pairs_empty_file", r"data\.jsonl: the data set is empty", recipe=DPO, data=b""),
]


@pytest.fixture
def folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fresh working folder; plugins named by a case do not leak into the next one."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(ENV_VAR, "")
    return tmp_path


def write_case(case: Case, folder: Path) -> list[str]:
    recipe = case.recipe.encode() if isinstance(case.recipe, str) else case.recipe
    (folder / case.recipe_name).write_bytes(recipe)
    (folder / "data.jsonl").write_bytes(case.data)
    for name, content in case.files.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_bytes(content)
    if case.args[:1] == ("--config",):
        return ["run", *case.args]
    return ["run", "--config", case.recipe_name, *case.args]


def test_there_are_at_least_40_distinct_cases() -> None:
    assert len({c.id for c in CASES}) == len(CASES) >= 40


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_input_is_one_line_and_writes_nothing(case: Case, folder: Path, capsys: pytest.CaptureFixture[str]) -> None:
    status = main(write_case(case, folder))
    err = capsys.readouterr().err
    assert status == 2, err
    assert err.endswith("\n") and err.count("\n") == 1, err
    expect = "trinity-like: error: " + case.expect.replace("{dir}", re.escape(str(folder)))
    assert re.fullmatch(expect, err.rstrip("\n")), f"\n{err}{expect}"
    assert not (folder / "runs").exists(), "a run directory was created"


# -- what is accepted -------------------------------------------------------------------------
def test_a_byte_order_mark_and_crlf_line_ends_are_accepted(tmp_path: Path) -> None:
    (tmp_path / "t.jsonl").write_bytes(
        b"\xef\xbb\xbf" + jsonl(TASK).replace(b"\n", b"\r\n") + b"\r\n" + jsonl({**TASK, "answer": "5"})
    )
    tasks = TaskSet(DatasetOptions(path=str(tmp_path / "t.jsonl"), shuffle=False))
    assert [(t.prompt, t.answer, t.task_id) for t in tasks.rows] == [
        (TASK["prompt"], "4", "t.jsonl:1"),
        (TASK["prompt"], "5", "t.jsonl:3"),
    ]


def test_the_base_recipe_of_the_table_runs(folder: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The control: every case above is the base recipe and data with one thing broken."""
    (folder / "r.yaml").write_text(GRPO.replace("total_steps: 1", "total_steps: 1\ncheckpoint:\n  interval: 1"))
    (folder / "data.jsonl").write_bytes(jsonl(TASK, {"prompt": "What is 3 + 3?", "answer": "6"}))
    status = main(["run", "--config", "r.yaml", "explorer.batch_size=2", "explorer.group_size=2"])
    assert status == 0, capsys.readouterr().err
    assert (folder / "runs" / "bad" / "checkpoints" / "step_000001" / "manifest.json").is_file()
