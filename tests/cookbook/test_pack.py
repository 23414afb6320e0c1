"""The cookbook pack: registered through the public registries only, its docstring examples run."""

from __future__ import annotations

import doctest

import pytest

import cookbook
import cookbook.envs.calculator
import cookbook.envs.twenty_questions
from trinity_like.builtins import BUILTIN_MODULES
from trinity_like.registry import ENV, TASK_SOURCE


@pytest.mark.parametrize("module", [cookbook.envs.calculator, cookbook.envs.twenty_questions])
def test_docstring_examples_run(module):
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0


def test_the_envs_are_the_packs_not_the_cores():
    assert not [m for m in BUILTIN_MODULES if m.split(".")[0] == "cookbook"]  # the core never names the pack
    for name in ("arithmetic", "calculator", "twenty_questions"):
        assert ENV.get(name).__module__ == f"cookbook.envs.{name}", name
    assert TASK_SOURCE.get("twenty_questions").__module__ == "cookbook.envs.twenty_questions"


def test_the_docstring_lists_what_the_pack_holds():
    doc = cookbook.__doc__
    for module in (
        "cookbook.envs",
        "cookbook.rl.train",
        "cookbook.rl.core",
        "cookbook.rl.advantages",
        "cookbook.rl.stream",
    ):
        assert f"``{module}``" in doc, module
    for name in ("arithmetic", "calculator", "twenty_questions"):
        assert f"``{name}``" in doc, name
