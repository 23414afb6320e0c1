"""The env API's types, their docstring examples, and the ENV registry."""

from __future__ import annotations

import doctest

import pytest

import trinity_like.envs.types
from trinity_like import cli
from trinity_like.envs.dataset import TaskEnvDataset, build_env_factory
from trinity_like.envs.types import StopCondition, check_reward, check_tokens
from trinity_like.errors import ConfigError, TrinityError
from trinity_like.experience import Task
from trinity_like.registry import ENV, REGISTRIES, UnknownNameError


def test_docstring_examples_run():
    result = doctest.testmod(trinity_like.envs.types, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0


def test_stop_condition_validates():
    assert StopCondition(max_tokens=3, stop_token_ids=[5, 6]).stop_token_ids == (5, 6)
    with pytest.raises(TrinityError, match="max_tokens must be >= 1"):
        StopCondition(max_tokens=0)
    with pytest.raises(TrinityError, match="stop_strings must be non-empty strings"):
        StopCondition(stop_strings="</calc>")
    with pytest.raises(TrinityError, match="stop_strings"):
        StopCondition(stop_strings=("",))


def test_token_and_reward_checks_name_what_is_wrong():
    assert check_tokens((1, 2), "obs") == [1, 2]
    with pytest.raises(TrinityError, match="^obs must be a list of token ids, got str$"):
        check_tokens("12", "obs")
    with pytest.raises(TrinityError, match="obs must hold int token ids, got float 1.5"):
        check_tokens([1, 1.5], "obs")
    with pytest.raises(TrinityError, match="obs must hold int token ids, got bool"):
        check_tokens([True], "obs")
    assert check_reward(1, "r") == 1.0
    for bad in (float("nan"), float("inf"), "1", None, True):
        with pytest.raises(TrinityError, match="r must be a finite number"):
            check_reward(bad, "r")


def test_env_registry_is_listed(capsys):
    """The concrete envs are the cookbook pack's (tests/cookbook), listed like any plugin's."""
    assert REGISTRIES["ENV"] is ENV
    assert {"arithmetic", "calculator"} <= set(ENV.names())
    assert cli.main(["list", "env"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("ENV (")
    assert ENV.describe("calculator") in out and ENV.describe("arithmetic") in out


def test_build_env_factory_errors_are_one_line(tok):
    with pytest.raises(UnknownNameError, match="unknown environment 'calculater'; did you mean 'calculator'"):
        build_env_factory("calculater", tokenizer=tok)
    with pytest.raises(ConfigError, match="^env.max_turn: unknown parameter .*did you mean 'max_turns'"):
        build_env_factory("calculator", {"max_turn": 2}, tokenizer=tok)
    with pytest.raises(ConfigError, match="^workflow.env_args.max_tokens: "):
        build_env_factory("arithmetic", {"max_tokens": "many"}, tokenizer=tok, where="workflow.env_args")
    with pytest.raises(TrinityError, match="max_turns must be >= 1"):
        build_env_factory("calculator", {"max_turns": 0}, tokenizer=tok)


def test_task_dataset_batches(tok):
    factory = build_env_factory("arithmetic", tokenizer=tok)
    tasks = [Task(f"What is {i} + 1?", str(i + 1), f"t{i}") for i in range(10)]
    dataset = TaskEnvDataset(tasks, factory, batch_size=4, group_size=3)
    assert len(dataset) == 2  # the last 2 tasks cannot fill a batch
    batch = dataset.get_batch(1)
    assert [b.task.task_id for b in batch] == ["t4", "t5", "t6", "t7"]
    assert all(len(b.make_envs()) == 3 for b in batch)
    with pytest.raises(TrinityError, match="batch 2 out of range 0..1"):
        dataset.get_batch(2)
    with pytest.raises(TrinityError, match="3 tasks cannot fill one batch of 4"):
        TaskEnvDataset(tasks[:3], factory, batch_size=4, group_size=3)
