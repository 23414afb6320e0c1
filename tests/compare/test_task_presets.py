"""The named task sources where methods separate: the arithmetic source with other defaults, checked by hand."""

from __future__ import annotations

import itertools
import re

from trinity_like.buffer.task_sources import task_source
from trinity_like.explorer.tasks import ArithmeticParams, arithmetic_source
from trinity_like.registry import TASK_SOURCE


def draw(name: str, split: str, size: int | None, seed: int = 0, args: dict | None = None):
    source, params = task_source(name, args or {}, where="buffer.tasks")
    return source(split=split, size=size, seed=seed, system_prompt=None, params=params)


def test_add2_is_the_arithmetic_source_with_two_digit_terms():
    assert "arithmetic_add2" in TASK_SOURCE and "2-digit + 2-digit" in TASK_SOURCE.describe("arithmetic_add2")
    hard = ArithmeticParams(ranges=((10, 99), (10, 99)))  # what examples/mix_hard.yaml writes out
    for split, size in (("train", 64), ("eval", 200)):
        mine = draw("arithmetic_add2", split, size, seed=3)
        theirs = arithmetic_source(split=split, size=size, seed=3, system_prompt=None, params=hard)
        assert [(t.prompt, t.answer) for t in mine] == [(t.prompt, t.answer) for t in theirs]
    for t in draw("arithmetic_add2", "train", 300):
        a, b = map(int, re.fullmatch(r"(\d+) \+ (\d+)", t.info["expression"]).groups())
        assert 10 <= a <= 99 and 10 <= b <= 99 and t.answer == str(a + b)
    assert draw("arithmetic_add2", "eval", 5, args={"ranges": [[10, 20]]})[0].info["expression"].startswith("1")


def test_mul1_holds_out_a_third_of_the_table_and_never_trains_on_it():
    train, held_out = draw("arithmetic_mul1", "train", None), draw("arithmetic_mul1", "eval", None)
    table = {f"{a} * {b}": a * b for a, b in itertools.product(range(1, 10), repeat=2)}  # all 81 problems
    seen = {t.info["expression"]: int(t.answer) for t in train + held_out}
    assert seen == table  # every problem once, each answered right
    assert not {t.info["expression"] for t in train} & {t.info["expression"] for t in held_out}
    assert len(held_out) == 24 and len(train) == 57  # eval_fraction 1/3 of 81, by hash with split seed 0
    assert held_out[0].system_prompt == "You are a calculator. Reply with only the number."
    other = [t.info["expression"] for t in draw("arithmetic_mul1", "eval", None, seed=5)]
    assert sorted(other) == sorted(t.info["expression"] for t in held_out)  # any seed: the same held-out set
