"""The built-in task sources (TASK_SOURCE): a seeded arithmetic generator, and a reasoning-gym adapter.

What a task source is called with and returns, and how a recipe names one
(``buffer.<key>.generator``), is in :mod:`trinity_like.buffer.task_sources`.

**Arithmetic.** "What is 47 + 8?" with a calculator system prompt is the default task: a
small instruct model starts at about 20 % and GRPO lifts it past 85 % within minutes
(docs/machines.md), so a recipe shows learning on a laptop. The held-out split never
overlaps training: every problem is assigned to one split by a hash of its expression
(and the split seed), so the two sets are disjoint by construction, whatever is drawn.

**reasoning-gym** (optional: ``pip install reasoning-gym==0.1.25``) generates GSM8K-style
word problems (``gsm_symbolic``) and many other procedural tasks offline from a seed; its
entries are kept in ``Task.info`` and scored by the ``reasoning_gym`` reward function
(in :mod:`.rewards`).

Example::

    tasks = arithmetic_tasks(ArithmeticParams(), split="train", count=64)
    held_out = arithmetic_tasks(ArithmeticParams(), split="eval", count=200)
"""

from __future__ import annotations

import hashlib
import importlib
import itertools
import random
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from trinity_like.errors import TrinityError
from trinity_like.experience import Task
from trinity_like.registry import TASK_SOURCE

CALCULATOR_PROMPT = "You are a calculator. Reply with only the number."
SPLITS = ("train", "eval")
MAX_UNSIZED_SPACE = 100_000  # most problems a source with size None enumerates
_OPS = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b}


@dataclass(frozen=True)
class ArithmeticParams:
    """The arithmetic problem space; the default is 2-digit + 1-digit addition."""

    ops: tuple[str, ...] = ("+",)  # operators drawn between terms, from "+", "-", "*"
    ranges: tuple[tuple[int, int], ...] = ((10, 99), (1, 9))  # inclusive range of term i (last reused)
    num_terms: int = 2  # terms per expression
    template: str = "What is {expression}? Answer with just the final number."  # user message
    eval_fraction: float = 0.25  # share of the problem space reserved for the eval split
    split_seed: int = 0  # which problems are held out; keep it fixed across a project

    def __post_init__(self) -> None:
        unknown = set(self.ops) - set(_OPS)
        if unknown or not self.ops:
            raise TrinityError(f"ArithmeticParams.ops: unknown {sorted(unknown)} (known: {sorted(_OPS)})")
        if self.num_terms < 2 or not self.ranges:
            raise TrinityError("ArithmeticParams: need num_terms >= 2 and at least one range")
        if any(lo > hi for lo, hi in self.ranges):
            raise TrinityError(f"ArithmeticParams.ranges: empty range in {self.ranges}")
        if not 0.0 < self.eval_fraction < 1.0:
            raise TrinityError(f"ArithmeticParams.eval_fraction must be in (0, 1), got {self.eval_fraction}")


def split_of(expression: str, params: ArithmeticParams) -> str:
    """The split an expression belongs to, fixed by a hash: the splits never overlap."""
    digest = hashlib.blake2b(f"{params.split_seed}|{expression}".encode(), digest_size=8).digest()
    return "eval" if int.from_bytes(digest, "little") / 2**64 < params.eval_fraction else "train"


def _space_size(params: ArithmeticParams) -> int:
    size = len(params.ops) ** (params.num_terms - 1)
    for i in range(params.num_terms):
        lo, hi = params.ranges[min(i, len(params.ranges) - 1)]
        size *= hi - lo + 1
    return size


def _expression(terms: Sequence[int], ops: Sequence[str]) -> str:
    return str(terms[0]) + "".join(f" {op} {term}" for op, term in zip(ops, terms[1:]))


def _draw(rng: random.Random, params: ArithmeticParams) -> tuple[str, int]:
    terms = [rng.randint(*params.ranges[min(i, len(params.ranges) - 1)]) for i in range(params.num_terms)]
    ops = [rng.choice(params.ops) for _ in range(params.num_terms - 1)]
    expression = _expression(terms, ops)
    # Left to right with the usual precedence: Python's own evaluation of the same text.
    value = eval(expression, {"__builtins__": {}}, {})  # noqa: S307 -- digits and + - * only
    return expression, int(value)


def _split_count(params: ArithmeticParams, split: str) -> int | None:
    """How many problems ``split`` holds, counted over the whole space (None: the space is too large to count)."""
    if _space_size(params) > MAX_UNSIZED_SPACE:
        return None
    ranges = [
        range(lo, hi + 1) for lo, hi in (params.ranges[min(i, len(params.ranges) - 1)] for i in range(params.num_terms))
    ]
    ops_once = dict.fromkeys(params.ops)  # an op listed twice: counted once
    return sum(
        split_of(_expression(terms, ops), params) == split
        for ops in itertools.product(ops_once, repeat=params.num_terms - 1)
        for terms in itertools.product(*ranges)
    )


_COUNT_AFTER = 1000  # consecutive repeats after which the split is counted (near its end; most calls stop earlier)


def iter_arithmetic_tasks(
    params: ArithmeticParams, split: str = "train", *, seed: int = 0, system_prompt: str = CALCULATOR_PROMPT
) -> Iterator[Task]:
    """Distinct problems of ``split`` in the order ``seed`` draws them, until the split is exhausted."""
    if split not in SPLITS:
        raise TrinityError(f"unknown split {split!r} (splits: {', '.join(SPLITS)})")
    rng = random.Random(f"{seed}|{split}")
    seen: set[str] = set()
    space = _space_size(params)
    total: int | None = None  # the split's size, once counted: stop at its last problem
    counted = False
    misses = 0
    index = 0
    # Rejection sampling; stop once every problem of the split is drawn (counted when draws start to
    # repeat), or after many consecutive repeats where the split is too large to count (it is
    # exhausted). The order is the draws' either way.
    while misses < 50 * space + 1000:
        expression, value = _draw(rng, params)
        if expression in seen or split_of(expression, params) != split:
            misses += 1
            if misses == _COUNT_AFTER and not counted:
                total, counted = _split_count(params, split), True
            if index == total:
                return
            continue
        misses = 0
        seen.add(expression)
        yield Task(
            prompt=params.template.format(expression=expression),
            answer=str(value),
            task_id=f"arith-{split}-{seed}-{index}",
            system_prompt=system_prompt or None,
            info={"expression": expression},
        )
        index += 1


def arithmetic_tasks(
    params: ArithmeticParams,
    split: str,
    count: int | None,
    *,
    seed: int = 0,
    system_prompt: str = CALCULATOR_PROMPT,
) -> list[Task]:
    """The first ``count`` problems of ``split`` (None, or a larger count: the whole split); ``""``: no system prompt."""
    tasks = iter_arithmetic_tasks(params, split, seed=seed, system_prompt=system_prompt)
    return list(tasks if count is None else itertools.islice(tasks, count))


@TASK_SOURCE.register_module("arithmetic")
def arithmetic_source(
    *, split: str, size: int | None, seed: int, system_prompt: str | None, params: ArithmeticParams
) -> list[Task]:
    """Seeded 'What is 47 + 8?' problems; the eval split never overlaps train (size None: the whole split)."""
    space = _space_size(params)
    if size is None and space > MAX_UNSIZED_SPACE:  # drawing a whole split of this size takes minutes
        raise TrinityError(
            f"size is unset (the whole split), but this problem space holds {space:,} problems, "
            f"more than the {MAX_UNSIZED_SPACE:,} drawn without a size: set size"
        )
    prompt = CALCULATOR_PROMPT if system_prompt is None else system_prompt
    return arithmetic_tasks(params, split, size, seed=seed, system_prompt=prompt)


# -- reasoning-gym ------------------------------------------------------------------------------
def load_reasoning_gym() -> Any:
    try:
        return importlib.import_module("reasoning_gym")
    except ModuleNotFoundError as exc:
        if exc.name and exc.name.split(".")[0] == "reasoning_gym":
            raise TrinityError(
                "reasoning-gym tasks need the optional package: pip install 'reasoning-gym==0.1.25' "
                "(or trinity-like[gym])"
            ) from None
        raise


def reasoning_gym_tasks(
    dataset: str,
    *,
    count: int,
    seed: int = 0,
    config: Mapping[str, Any] | None = None,
    system_prompt: str | None = None,
) -> list[Task]:
    """``count`` tasks from a reasoning-gym generator (``gsm_symbolic`` is GSM8K-style).

    ``config`` holds the generator's own options (see reasoning-gym's docs); the entry is
    kept in ``Task.info["entry"]`` for the ``reasoning_gym`` reward function.
    """
    rg = load_reasoning_gym()
    data = rg.create_dataset(dataset, seed=seed, size=count, **dict(config or {}))
    tasks = []
    for i, entry in enumerate(data):
        tasks.append(
            Task(
                prompt=entry["question"],
                answer=str(entry["answer"]),
                task_id=f"rg-{dataset}-{seed}-{i}",
                system_prompt=system_prompt,
                info={"entry": _jsonable(entry), "dataset": dataset},
            )
        )
    return tasks


@dataclass(frozen=True)
class ReasoningGymParams:
    """Which reasoning-gym dataset, and its own options."""

    dataset: str = "gsm_symbolic"  # reasoning-gym dataset (also: generator "reasoning_gym:<dataset>")
    config: dict[str, Any] = field(default_factory=dict)  # the dataset's options (see reasoning-gym's docs)
    unsized_count: int = 100  # tasks drawn when the dataset's `size` is unset (the generators never run out)


EVAL_SEED_OFFSET = 10**6  # the eval split draws from another seed: its tasks differ from train's


@TASK_SOURCE.register_module("reasoning_gym")
def reasoning_gym_source(
    *, split: str, size: int | None, seed: int, system_prompt: str | None, params: ReasoningGymParams
) -> list[Task]:
    """reasoning-gym's procedural tasks (GSM8K-style gsm_symbolic, ...): pip install reasoning-gym."""
    seed = seed + (EVAL_SEED_OFFSET if split == "eval" else 0)
    return reasoning_gym_tasks(
        params.dataset,
        count=params.unsized_count if size is None else size,
        seed=seed,
        config=params.config,
        system_prompt=system_prompt,
    )


def _jsonable(value: Any) -> Any:
    """reasoning-gym entries may hold tuples or sets; rows must stay JSON-serialisable."""
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set)):
        return [_jsonable(v) for v in value]
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    return str(value)
