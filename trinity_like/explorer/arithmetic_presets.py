"""Named arithmetic task sources (TASK_SOURCE) where methods separate: ``arithmetic_add2``, ``arithmetic_mul1``.

The default ``arithmetic`` task (2-digit + 1-digit addition) saturates within ten steps on
SmolLM2-135M-Instruct: GSPO, CISPO, DAPO and MIX all end between 91 % and 96 % held-out
(benchmarks/results/signals.md), so a better objective cannot show there. These presets are
the ``arithmetic`` source with other defaults -- every ``generator_args`` key of
:class:`~trinity_like.explorer.tasks.ArithmeticParams` still applies -- under names a recipe
and a comparison can cite:

- ``arithmetic_add2``: "What is 83 + 68?", both terms 10..99 (8,100 problems; about 2,000
  held out). Greedy, SmolLM2-135M-Instruct answers 20.5 % of 200 held-out problems; sampled
  at T = 1 about 3 % in the first steps, so most groups hold no right answer and GRPO alone
  reaches 55 % after 10 steps where MIX reaches 70.5 % (examples/mix_hard.yaml).
- ``arithmetic_mul1``: "What is 7 * 8?", both terms 1..9 (81 problems). A third of them
  (``eval_fraction``) is held out by a hash of the expression: 24 problems (split seed 0),
  and "8 * 7" may be trained while "7 * 8" is held out, so the held-out split tests recall
  of the table, not unseen facts. Greedy, SmolLM2-135M-Instruct answers 16 of the 24
  (67 %; it often explains instead of answering): headroom, on a small held-out set.

As with ``arithmetic``, the held-out split never overlaps training, whatever the seed::

    buffer:
      tasks: {generator: arithmetic_add2}
      eval_tasks: {generator: arithmetic_add2, split: eval, size: 200}
"""

from __future__ import annotations

from dataclasses import dataclass

from trinity_like.experience import Task
from trinity_like.explorer.tasks import ArithmeticParams, arithmetic_source
from trinity_like.registry import TASK_SOURCE


@dataclass(frozen=True)
class Add2Params(ArithmeticParams):
    """``arithmetic`` with both terms 2-digit."""

    ranges: tuple[tuple[int, int], ...] = ((10, 99), (10, 99))  # inclusive range of term i (last reused)


@dataclass(frozen=True)
class Mul1Params(ArithmeticParams):
    """``arithmetic`` with single-digit multiplication; a third of the 81 problems held out."""

    ops: tuple[str, ...] = ("*",)  # operators drawn between terms
    ranges: tuple[tuple[int, int], ...] = ((1, 9),)  # inclusive range of every term
    eval_fraction: float = 1 / 3  # share of the problem space held out (the space is small)


@TASK_SOURCE.register_module("arithmetic_add2")
def add2_source(
    *, split: str, size: int | None, seed: int, system_prompt: str | None, params: Add2Params
) -> list[Task]:
    """2-digit + 2-digit addition ('What is 83 + 68?'): SmolLM2-135M starts at ~20 % held-out."""
    return arithmetic_source(split=split, size=size, seed=seed, system_prompt=system_prompt, params=params)


@TASK_SOURCE.register_module("arithmetic_mul1")
def mul1_source(
    *, split: str, size: int | None, seed: int, system_prompt: str | None, params: Mul1Params
) -> list[Task]:
    """Single-digit multiplication ('What is 7 * 8?'), 1..9 x 1..9 with a third held out."""
    return arithmetic_source(split=split, size=size, seed=seed, system_prompt=system_prompt, params=params)
