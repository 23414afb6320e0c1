"""The arithmetic generator: seeded, correct answers, and a held-out split that never overlaps."""

from __future__ import annotations

import random

import pytest

from trinity_like.errors import TrinityError
from trinity_like.explorer.arithmetic_presets import Mul1Params
from trinity_like.explorer.tasks import ArithmeticParams, arithmetic_tasks, reasoning_gym_tasks, split_of


def test_default_tasks_are_the_calculator_problems():
    (task,) = arithmetic_tasks(ArithmeticParams(), "train", 1)
    a, b = (int(x) for x in task.info["expression"].split(" + "))
    assert 10 <= a <= 99 and 1 <= b <= 9
    assert task.answer == str(a + b)
    assert task.prompt == f"What is {a} + {b}? Answer with just the final number."
    assert task.messages()[0] == {"role": "system", "content": "You are a calculator. Reply with only the number."}


def test_splits_are_disjoint_cover_the_space_and_are_seeded():
    params = ArithmeticParams()  # 90 * 9 = 810 problems
    train = arithmetic_tasks(params, "train", 10_000)
    held = arithmetic_tasks(params, "eval", 10_000)
    train_x = {t.info["expression"] for t in train}
    held_x = {t.info["expression"] for t in held}
    assert not train_x & held_x
    assert len(train_x) == len(train) and len(held_x) == len(held)
    assert len(train_x | held_x) == 810  # every problem, exactly once
    assert 0.15 < len(held) / 810 < 0.35
    again = arithmetic_tasks(params, "train", 20)
    other = arithmetic_tasks(params, "train", 20, seed=1)
    assert [t.info["expression"] for t in again] == [t.info["expression"] for t in train[:20]]
    assert {t.info["expression"] for t in other} <= train_x  # another order, the same split
    assert [t.info["expression"] for t in other] != [t.info["expression"] for t in again]


def drawn_until_exhausted(params: ArithmeticParams, split: str, seed: int) -> list[str]:
    """The split's problems in draw order as the generator drew them before it counted the split:
    rejection sampling until 50 x space + 1000 draws in a row bring nothing new."""
    rng, seen, order, misses = random.Random(f"{seed}|{split}"), set(), [], 0
    space = 1
    for i in range(params.num_terms):
        lo, hi = params.ranges[min(i, len(params.ranges) - 1)]
        space *= (hi - lo + 1) * (len(params.ops) if i else 1)
    while misses < 50 * space + 1000:
        terms = [rng.randint(*params.ranges[min(i, len(params.ranges) - 1)]) for i in range(params.num_terms)]
        ops = [rng.choice(params.ops) for _ in range(params.num_terms - 1)]
        expression = " ".join([str(terms[0]), *(f"{op} {t}" for op, t in zip(ops, terms[1:]))])
        if expression in seen or split_of(expression, params) != split:
            misses += 1
            continue
        misses = 0
        seen.add(expression)
        order.append(expression)
    return order


@pytest.mark.parametrize(
    "params",
    [
        ArithmeticParams(),
        Mul1Params(),
        ArithmeticParams(ops=("+", "-", "*"), ranges=((1, 4),), num_terms=3, eval_fraction=0.5),
        ArithmeticParams(ops=("+", "+", "-"), ranges=((1, 9), (-3, 3))),  # "+" drawn twice as often
    ],
)
def test_a_whole_split_stops_at_its_last_problem_with_the_same_order_as_drawing_until_exhausted(params):
    # counting the split lets the generator stop at once (add2's whole train split: 2.7 s -> 0.4 s);
    # what it yields, and in which order, must not change: runs and comparisons recorded before replay
    for split in ("train", "eval"):
        for seed in (0, 3):
            got = [t.info["expression"] for t in arithmetic_tasks(params, split, None, seed=seed)]
            assert got == drawn_until_exhausted(params, split, seed)


@pytest.mark.parametrize("ops", [("-",), ("*",), ("+", "-", "*")])
def test_answers_follow_an_independent_evaluation(ops):
    params = ArithmeticParams(ops=ops, ranges=((1, 9),), num_terms=3)
    for task in arithmetic_tasks(params, "train", 30):
        tokens = task.info["expression"].split()
        # Oracle: explicit precedence -- fold products first, then left-to-right sums.
        terms, signs = [int(tokens[0])], []
        for op, value in zip(tokens[1::2], tokens[2::2]):
            if op == "*":
                terms[-1] *= int(value)
            else:
                signs.append(1 if op == "+" else -1)
                terms.append(int(value))
        assert int(task.answer) == terms[0] + sum(s * t for s, t in zip(signs, terms[1:]))


def test_bad_params_are_errors():
    with pytest.raises(TrinityError, match="ops"):
        ArithmeticParams(ops=("/",))
    with pytest.raises(TrinityError, match="split"):
        arithmetic_tasks(ArithmeticParams(), "test", 1)


def test_reasoning_gym_adapter():
    try:
        import reasoning_gym  # noqa: F401
    except ModuleNotFoundError:
        with pytest.raises(TrinityError, match="pip install"):
            reasoning_gym_tasks("gsm_symbolic", count=2)
        return
    from trinity_like.explorer.rewards import build_reward_fn

    tasks = reasoning_gym_tasks("basic_arithmetic", count=3, seed=1)
    assert len(tasks) == 3 and all(t.answer for t in tasks)
    fn = build_reward_fn("reasoning_gym")
    for t in tasks:
        assert fn({"response": t.answer, "task": t}) == 1.0
        assert fn({"response": "not it", "task": t}) < 1.0
    import json

    exact = build_reward_fn("exact_match")
    for t in reasoning_gym_tasks("gsm_symbolic", count=3, seed=0):
        json.dumps(t.to_dict())  # rows must stay JSON-serialisable
        assert fn({"response": f"\\boxed{{{t.answer}}}", "task": t}) == 1.0
        assert exact({"response": f"So the answer is {t.answer}.", "answer": t.answer}) == 1.0


def test_an_unsized_source_over_a_huge_space_is_an_error_naming_the_dataset(tmp_path):
    """Without a size the source would draw a whole split of 810,000 problems by rejection
    sampling -- minutes of silence. It says to set the size instead, before any run folder exists."""
    from trinity_like.config import load_plan
    from trinity_like.errors import ConfigError
    from trinity_like.explorer.tasks import MAX_UNSIZED_SPACE, arithmetic_source
    from trinity_like.pipeline.data_sources import generated_tasks

    big = ArithmeticParams(ranges=((100, 999),))
    with pytest.raises(TrinityError, match=r"holds 810,000 problems.*set size"):
        arithmetic_source(split="train", size=None, seed=0, system_prompt=None, params=big)
    assert len(arithmetic_source(split="eval", size=3, seed=0, system_prompt=None, params=big)) == 3
    small = arithmetic_source(split="eval", size=None, seed=0, system_prompt=None, params=ArithmeticParams())
    assert 0 < len(small) < MAX_UNSIZED_SPACE
    recipe = tmp_path / "r.yaml"
    recipe.write_text("buffer:\n  tasks:\n    generator: arithmetic\n    generator_args: {ranges: [[100, 999]]}\n")
    plan = load_plan(recipe, [f"run_root={tmp_path / 'runs'}"])
    ds = plan.stages[0].config.buffer.tasks
    with pytest.raises(ConfigError, match=r"^buffer\.tasks: size is unset .* set size$"):
        generated_tasks(ds, "buffer.tasks")
    assert not (tmp_path / "runs").exists()
