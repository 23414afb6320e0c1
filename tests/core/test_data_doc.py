"""docs/data.md, bringing your own data, runs as written: its commands, its reward plugin, its
client-loop code, its plan and error excerpts, and its two tables (every dataset key; the knobs
both doors share) checked against the code."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "data.md"
TINY = [
    "model.path=tiny-random",
    "model.max_response_tokens=8",
    "trainer.total_steps=1",
    "explorer.batch_size=2",
    "explorer.group_size=2",
    "buffer.eval_tasks.size=2",
    "monitor.progress=false",
]


def blocks(lang: str) -> list[str]:
    return re.findall(rf"^```{lang}\n(.*?)^```", DOC.read_text(), flags=re.S | re.M)


def cli(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "RAY_AUTH_MODE": "disabled", "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-m", "trinity_like.cli", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300
    )


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    """A folder like the repository's root for the doc's relative paths, whose runs stay in it."""
    (tmp_path / "examples").symlink_to(ROOT / "examples")
    (tmp_path / "my_reward.py").write_text(reward_block())
    return tmp_path


def reward_block() -> str:
    (block,) = [b for b in blocks("python") if b.startswith("# my_reward.py\n")]
    return block


def test_the_readme_links_the_page():
    assert "(docs/data.md)" in (ROOT / "README.md").read_text()


@pytest.mark.parametrize("command", [ln for b in blocks("bash") for ln in b.splitlines() if ln.strip()])
def test_every_command_runs(command, workdir):
    argv = shlex.split(command)
    assert argv[0] == "trinity-like"
    runs = argv[1] == "run" and "--dry-run" not in argv
    r = cli(argv[1:] + (TINY + ["trainer.engine=local"] if runs else []), workdir)
    assert r.returncode == 0, r.stderr[-2000:]
    if runs:
        evals = [json.loads(x) for x in (workdir / "runs/gsm8k_style/evals.jsonl").read_text().splitlines()]
        # the held-out answers carry what the reward compared and the whole prompt
        assert evals and all(e["reference"] == e["answer"].rsplit("#### ", 1)[1] for e in evals)
        assert all(e["messages"][0]["role"] == "system" for e in evals)


def test_the_data_line_shown_is_a_line_of_the_shipped_file():
    (line,) = blocks("json")
    shipped = (ROOT / "examples/data/gsm8k_style_train.jsonl").read_text().splitlines()
    assert json.loads(line) in [json.loads(x) for x in shipped]


def test_the_plan_excerpt_is_what_dry_run_prints(workdir):
    (excerpt,) = [b for b in blocks("text") if "first prompt" in b]
    r = cli(["run", "--config", "examples/gsm8k_style.yaml", "--dry-run"], workdir)
    assert r.returncode == 0 and excerpt in r.stdout, r.stdout


def test_the_error_excerpt_is_what_validate_prints(workdir):
    (excerpt,) = [b for b in blocks("text") if "error:" in b]
    r = cli(["validate", "examples/gsm8k_style.yaml", "buffer.eval_tasks.prompt_key=prompt"], workdir)
    assert r.returncode == 2 and r.stderr == excerpt, r.stderr


def table(heading: str) -> list[list[str]]:
    lines = DOC.read_text().split(heading, 1)[1].splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith("|"))
    end = next((i for i in range(start, len(lines)) if not lines[i].startswith("|")), len(lines))
    return [[c.strip() for c in r.strip().strip("|").split("|")] for r in lines[start + 2 : end]]


def test_every_dataset_key_is_in_the_table():
    from trinity_like.config.schema import DatasetConfig

    documented = [row[0].strip("`") for row in table("## Every dataset key")]
    assert documented == list(DatasetConfig.model_fields)


def _default_of_key(path: str):
    from pydantic import BaseModel

    from trinity_like.config.schema import Config

    model, value = Config, None
    for part in path.split("."):
        if part == "tasks":  # buffer.tasks is optional: its keys are DatasetConfig's
            from trinity_like.config.schema import DatasetConfig

            model = DatasetConfig
            continue
        assert isinstance(model, type) and issubclass(model, BaseModel), path
        assert part in model.model_fields, path
        value = model.model_fields[part].default
        model = model.model_fields[part].annotation if not isinstance(value, BaseModel) else type(value)
    return value


def _client_default(name: str):
    from cookbook.envs.arithmetic import AnswerEnvParams
    from cookbook.rl.core import RLTrainConfig
    from trinity_like.buffer.datasets import load_tasks

    if name.startswith("load_tasks("):
        param = inspect.signature(load_tasks).parameters[name[len("load_tasks(") : -1]]
        return param.default
    owner, field_name = name.split(".")
    cls = {"RLTrainConfig": RLTrainConfig, "AnswerEnvParams": AnswerEnvParams}[owner]
    f = {f.name: f for f in dataclasses.fields(cls)}[field_name]
    return f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default


def test_the_table_of_both_doors_matches_the_code():
    rows = table("## One meaning at both doors")
    assert rows
    for key, key_default, client, client_default, _ in rows:
        key, client = key.strip("`"), client.strip("`")
        assert _default_of_key(key) == ast.literal_eval(key_default.strip("`")), key
        names = [c.strip().strip("`") for c in client.split(",")]
        defaults = [d.strip().strip("`") for d in client_default.split(",")] if client_default else []
        if names[0].startswith("RLTrainConfig.") and len(names) > 1:  # beta1, beta2
            names = [names[0]] + [f"RLTrainConfig.{n}" for n in names[1:]]
        for name, default in zip(names, defaults, strict=False):
            assert _client_default(name) == ast.literal_eval(default), name
        if not defaults:  # a required argument
            assert _client_default(names[0]) is inspect.Parameter.empty, names[0]


def test_the_plugin_guide_shows_the_same_reward_function():
    assert reward_block() in (ROOT / "plugins" / "README.md").read_text()


def test_the_reward_reads_the_number_after_the_marker_on_every_shipped_answer():
    """Oracle: the text after '#### ' of each reference, read by hand; exact_match and the guide's
    reward score that number 1 and its successor 0."""
    from trinity_like.buffer.datasets import load_tasks
    from trinity_like.explorer.rewards import exact_match, exact_match_reference

    namespace: dict = {}
    exec(compile(reward_block().replace("@REWARD_FN.register_module", "# "), "my_reward.py", "exec"), namespace)
    mine = namespace["last_line_number"]
    for name in ("gsm8k_style_train.jsonl", "gsm8k_style_heldout.jsonl"):
        tasks = load_tasks(str(ROOT / "examples/data" / name), prompt_key="question")
        assert len(tasks) == (20 if "train" in name else 10)
        for t in tasks:
            want = t.answer.split("#### ")[1]
            assert exact_match_reference(t.answer) == want == mine.reference_of(t.answer)
            for reward in (exact_match, mine):
                assert reward(response=f"So the answer is\n{want}", answer=t.answer) == 1.0
                assert reward(response=f"So the answer is\n{int(want) + 1}", answer=t.answer) == 0.0
    assert exact_match_reference("Total:\n#### 1,234") == "1234" and exact_match_reference("Paris") == "Paris"


def test_the_client_loop_code_runs_on_the_tiny_model(tmp_path, monkeypatch):
    (code,) = [b for b in blocks("python") if "load_tasks" in b]
    for old, new in [
        ('"smollm2-135m-instruct"', '"tiny-random"'),
        ("iterations=10", "iterations=2"),
        ("batch_size=4", "batch_size=2"),
        ("group_size=8", "group_size=2"),
        ("eval_every=5", "eval_every=1, progress=False"),
        ('"max_tokens": 96', '"max_tokens": 4'),
        ('"examples/', f'"{ROOT}/examples/'),
    ]:
        assert old in code, old
        code = code.replace(old, new)
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    exec(compile(code, "docs/data.md", "exec"), namespace)
    result = namespace["result"]
    assert [e["step"] for e in result.evals] == [0, 1, 2] and all(e["eval/tasks"] == 10 for e in result.evals)
    assert namespace["held_out"][0].messages()[0]["content"].startswith("Solve the problem.")
