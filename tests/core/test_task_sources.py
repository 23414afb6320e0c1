"""Task sources are a registry like every other kind: built-ins, plugins, errors at resolve time."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import textwrap

import pytest

from trinity_like.cli import main
from trinity_like.config import load_plan
from trinity_like.errors import ConfigError
from trinity_like.experience import Task
from trinity_like.explorer.tasks import CALCULATOR_PROMPT, ArithmeticParams, ReasoningGymParams, arithmetic_tasks
from trinity_like.pipeline.data_sources import generated_tasks
from trinity_like.registry import TASK_SOURCE


@dataclasses.dataclass(frozen=True)
class _CountParams:
    upto: int = 10  # largest number asked about


def _count_tasks(*, split: str, size: int | None, seed: int, system_prompt: str | None, params: _CountParams):
    """'What comes after n?' for n < upto (a test source)."""
    tasks = [
        Task(
            prompt=f"What comes after {n}?",
            answer=str(n + 1),
            task_id=f"{split}-{seed}-{n}",
            system_prompt=system_prompt,
        )
        for n in range(params.upto)
    ]
    return iter(tasks[:size])  # any iterable of tasks will do


TASK_SOURCE.register_module("tstest_count", module=_count_tasks, force=True)


def recipe(tmp_path, tasks: str) -> str:
    path = tmp_path / "r.yaml"
    path.write_text(
        "name: t\nalgorithm:\n  type: grpo\nbuffer:\n  tasks:\n" + textwrap.indent(textwrap.dedent(tasks), "    ")
    )
    return path


def error_of(path) -> str:
    with pytest.raises(ConfigError) as info:
        load_plan(path)
    return str(info.value)


def test_the_built_in_sources_are_registered_and_listed(capsys):
    assert {"arithmetic", "reasoning_gym"} <= set(TASK_SOURCE.names())
    assert main(["list", "task_source"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("TASK_SOURCE (") and "  arithmetic " in out and "  reasoning_gym " in out
    assert main(["list"]) == 0
    assert "\nTASK_SOURCE (" in capsys.readouterr().out


def test_a_generated_dataset_is_what_the_source_returns(tmp_path):
    (stage,) = load_plan(recipe(tmp_path, "generator: arithmetic\nsize: 5\nseed: 3\n")).stages
    tasks = generated_tasks(stage.config.buffer.tasks, "buffer.tasks")
    # the dataset's seed orders the problems; no system prompt set: the calculator's
    assert tasks == arithmetic_tasks(ArithmeticParams(), "train", 5, seed=3)
    assert tasks[0].system_prompt == CALCULATOR_PROMPT
    (stage,) = load_plan(
        recipe(
            tmp_path,
            "generator: arithmetic\nsize: 2\nsystem_prompt: ''\ngenerator_args:\n  ranges: [[1, 3]]\n  ops: ['*']\n",
        )
    ).stages
    tasks = generated_tasks(stage.config.buffer.tasks, "buffer.tasks")
    assert [t.system_prompt for t in tasks] == [None, None]
    assert all(" * " in t.info["expression"] for t in tasks)


def test_unknown_sources_and_args_fail_at_resolve_time_with_file_and_line(tmp_path):
    msg = error_of(recipe(tmp_path, "generator: arithmetc\n"))
    assert msg.startswith(
        f"{tmp_path / 'r.yaml'}:6: buffer.tasks.generator: unknown task source 'arithmetc'; "
        "did you mean 'arithmetic'? (registered: arithmetic, arithmetic_add2, arithmetic_mul1, reasoning_gym"
    )
    msg = error_of(recipe(tmp_path, "generator: arithmetic\ngenerator_args:\n  num_term: 3\n"))
    assert msg.startswith(f"{tmp_path / 'r.yaml'}:8: buffer.tasks.generator_args.num_term: unknown parameter")
    assert "did you mean 'num_terms'" in msg
    msg = error_of(recipe(tmp_path, "generator: arithmetic\ngenerator_args:\n  ops: ['/']\n"))
    assert msg.startswith(f"{tmp_path / 'r.yaml'}:7: buffer.tasks.generator_args: ArithmeticParams.ops: unknown ['/']")
    msg = error_of(recipe(tmp_path, "generator: 'arithmetic:gsm'\n"))
    assert "buffer.tasks.generator: task source 'arithmetic' takes no ':<dataset>' part" in msg


def test_a_colon_names_the_dataset_of_a_source_that_has_one(tmp_path):
    from trinity_like.buffer.task_sources import task_source

    source, params = task_source("reasoning_gym:basic_arithmetic", {"config": {"min_terms": 2}}, "buffer.tasks")
    assert source is TASK_SOURCE.get("reasoning_gym")
    assert params == ReasoningGymParams(dataset="basic_arithmetic", config={"min_terms": 2})
    load_plan(recipe(tmp_path, "generator: 'reasoning_gym:gsm_symbolic'\n"))  # validates without the package
    msg = error_of(recipe(tmp_path, "generator: 'reasoning_gym:gsm_symbolic'\ngenerator_args:\n  dataset: x\n"))
    assert "buffer.tasks.generator_args.dataset: set twice" in msg


def test_a_registered_source_is_used_from_a_recipe(tmp_path):
    (stage,) = load_plan(
        recipe(tmp_path, "generator: tstest_count\nsize: 3\nsystem_prompt: Count.\ngenerator_args:\n  upto: 5\n")
    ).stages
    tasks = generated_tasks(stage.config.buffer.tasks, "buffer.tasks")
    assert [(t.prompt, t.answer, t.system_prompt) for t in tasks] == [
        ("What comes after 0?", "1", "Count."),
        ("What comes after 1?", "2", "Count."),
        ("What comes after 2?", "3", "Count."),
    ]
    msg = error_of(recipe(tmp_path, "generator: tstest_count\ngenerator_args:\n  upot: 5\n"))
    assert "buffer.tasks.generator_args.upot: unknown parameter of _count_tasks; did you mean 'upto'?" in msg


PLUGIN = '''
"""A plugin with a task source."""
from dataclasses import dataclass

from trinity_like.experience import Task
from trinity_like.registry import TASK_SOURCE


@dataclass(frozen=True)
class EchoParams:
    word: str = "hi"  # the word to repeat


@TASK_SOURCE.register_module("echo")
def echo_tasks(*, split, size, seed, system_prompt, params: EchoParams):
    """Repeat a word (a plugin's task source)."""
    return [Task(prompt=f"Say {params.word}.", answer=params.word) for _ in range(size or 4)]
'''


def test_a_plugin_registers_a_source_that_list_and_validate_see(tmp_path):
    (tmp_path / "echo_tasks.py").write_text(PLUGIN)
    (tmp_path / "r.yaml").write_text(
        "plugins: [./echo_tasks.py]\nbuffer:\n  tasks:\n    generator: echo\n    generator_args: {word: hello}\n"
    )
    env = {**os.environ, "RAY_AUTH_MODE": "disabled"}
    env.pop("TRINITY_LIKE_PLUGINS", None)
    out = subprocess.run(
        [sys.executable, "-m", "trinity_like.cli", "list", "task_source", "--plugin", str(tmp_path / "echo_tasks.py")],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert out.returncode == 0 and "  echo " in out.stdout and "a plugin's task source" in out.stdout, out.stderr
    out = subprocess.run(
        [sys.executable, "-m", "trinity_like.cli", "validate", str(tmp_path / "r.yaml")],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    (tmp_path / "r.yaml").write_text((tmp_path / "r.yaml").read_text().replace("word:", "wrd:"))
    out = subprocess.run(
        [sys.executable, "-m", "trinity_like.cli", "validate", str(tmp_path / "r.yaml")],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert (
        out.returncode == 2
        and f"{tmp_path / 'r.yaml'}:5: buffer.tasks.generator_args.wrd: unknown parameter" in out.stderr
    )


def test_list_models_shows_each_built_in_model_on_one_line(capsys):
    from trinity_like.models.resolve import BUILTIN_MODELS

    assert main(["list", "models"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == f"MODELS ({len(BUILTIN_MODELS)})" and len(lines) == 1 + len(BUILTIN_MODELS)
    for name, model in BUILTIN_MODELS.items():
        assert any(ln.split()[0] == name and ln.endswith(model.description) for ln in lines[1:])
    assert main(["list"]) == 0
    assert "\nMODELS (" in capsys.readouterr().out
    assert main(["list", "modls"]) == 2
    assert "did you mean 'models'?" in capsys.readouterr().err


def test_list_into_a_pipe_that_closes_early_is_quiet():
    # `true` exits without reading: every write of `list` meets a closed pipe
    cmd = f"set -o pipefail; {sys.executable} -m trinity_like.cli list | true"
    out = subprocess.run(
        ["bash", "-c", cmd],
        capture_output=True,
        text=True,
        env={**os.environ, "RAY_AUTH_MODE": "disabled"},
        timeout=300,
    )
    assert out.returncode == 0 and "Traceback" not in out.stderr, out.stderr
