"""The calculator env: its parser, its turns, and a tiny model that learnt to call it."""

from __future__ import annotations

from fractions import Fraction

import pytest
import torch

from cookbook.envs.calculator import (
    CALCULATOR_SYSTEM_PROMPT,
    EXAMPLE_CONVERSATION,
    MAX_DIGITS,
    MAX_EXPRESSION_CHARS,
    CalcError,
    calculator_tasks,
    evaluate,
    format_value,
)
from trinity_like.envs.dataset import build_env_factory
from trinity_like.envs.experience import group_experiences
from trinity_like.envs.rollout import RolloutParams, rollout_groups
from trinity_like.experience import Task
from trinity_like.explorer.engine import NativeEngine
from trinity_like.explorer.tasks import CALCULATOR_PROMPT
from trinity_like.models.chat import render_prompt
from trinity_like.models.tiny import build_tiny_model

TASK = Task("What is 626 + 562?", "1188", "t0", system_prompt=CALCULATOR_PROMPT)


@pytest.mark.parametrize(
    "expression, value",
    [
        ("123+456", 579),
        (" 123 + 456 = ", 579),
        ("2*(3+4)-10/4", Fraction(23, 2)),
        ("-3+5", 2),
        ("--3", 3),
        ("((7))", 7),
        ("10-2-3", 5),
        ("2+3*4", 14),
        ("100/8/5", Fraction(5, 2)),
        ("+4*-2", -8),
        ("0/5", 0),
    ],
)
def test_calculator_evaluates_integer_arithmetic(expression, value):
    assert evaluate(expression) == value


@pytest.mark.parametrize(
    "expression, error",
    [
        ("", "empty expression"),
        ("=", "empty expression"),
        ("1+", "incomplete expression"),
        ("1 2", "unexpected '2'"),
        ("abc", "unexpected character 'a'"),
        ("2**3", "unexpected '*'"),
        ("(1+2", "incomplete expression"),
        ("(1+2]", "unexpected character ']'"),
        ("1)", "unexpected ')'"),
        ("__import__('os')", "unexpected character '_'"),
        ("1.5+1", "unexpected character '.'"),
        ("1/0", "division by zero"),
        ("1/(2-2)", "division by zero"),
        ("1+" * 60 + "1", f"longer than {MAX_EXPRESSION_CHARS} characters"),
        ("9" * (MAX_DIGITS + 1), "digits"),
    ],
)
def test_bad_expressions_are_calc_errors(expression, error):
    with pytest.raises(CalcError, match=error.replace("(", r"\(").replace(")", r"\)").replace("*", r"\*")):
        evaluate(expression)


def test_values_are_formatted_for_the_model():
    assert [format_value(Fraction(x)) for x in (579, -3, Fraction(5, 2), Fraction(1, 3))] == [
        "579",
        "-3",
        "2.5",
        "0.333333",
    ]


def env_of(tok, task=TASK, **params):
    return build_env_factory("calculator", params, tokenizer=tok).group_builder(task, 1).make_envs()[0]


def ids(tok, text):
    return tok.encode(text, add_special_tokens=False)


def test_the_prompt_has_the_tool_instructions_instead_of_the_task_system_prompt(tok):
    prompt, stop = env_of(tok).initial_observation()
    system, question = {"role": "system", "content": CALCULATOR_SYSTEM_PROMPT}, {"role": "user", "content": TASK.prompt}
    assert prompt == render_prompt(tok, [system, *EXAMPLE_CONVERSATION, question])
    assert stop.stop_strings == ("</calc>",) and stop.stop_token_ids is None
    assert env_of(tok, example=False).initial_observation()[0] == render_prompt(tok, [system, question])
    assert env_of(tok, system_prompt="", example=False).initial_observation()[0] == render_prompt(tok, TASK.messages())


@pytest.mark.parametrize(
    "action, reply",
    [
        ("<calc>626+562</calc>", "626+562 = 1188"),
        ("Let me compute. <calc>626 + 562</calc><|im_end|>", "626 + 562 = 1188"),  # ended at the end-of-turn token
        ("<calc>1/0</calc>", "1/0: error: division by zero"),
        ("<calc>626 plus 562</calc>", "626 plus 562: error: unexpected character 'p'"),
    ],
)
def test_a_call_is_answered_in_a_message_appended_to_the_tokens(tok, action, reply):
    env = env_of(tok)
    prompt, _ = env.initial_observation()
    action_ids = ids(tok, action)
    result = env.step(action_ids)
    assert not result.episode_done and result.reward == 0.0
    assert result.next_observation[: len(prompt) + len(action_ids)] == prompt + action_ids  # token in, token out
    appended = tok.decode(result.next_observation[len(prompt) + len(action_ids) :])
    closing = "" if action.endswith("<|im_end|>") else "<|im_end|>"
    assert appended == f"{closing}\n<|im_start|>user\n{reply}<|im_end|>\n<|im_start|>assistant\n"
    assert result.metrics == {"tool_calls": 1.0, "tool_errors": float("error" in reply)}


def test_the_answer_is_scored_and_ends_the_episode(tok):
    env = env_of(tok)
    env.initial_observation()
    env.step(ids(tok, "<calc>626+562</calc>"))
    result = env.step(ids(tok, "The answer is 1188.<|im_end|>"))
    assert result.episode_done and result.reward == 1.0
    assert result.metrics == {"correct": 1.0, "used_tool": 1.0}
    wrong = env_of(tok).step(ids(tok, "1189<|im_end|>"))
    assert wrong.episode_done and wrong.reward == 0.0 and wrong.metrics == {"correct": 0.0, "used_tool": 0.0}


def test_the_last_turn_is_scored_even_with_a_call(tok):
    env = env_of(tok, max_turns=2)
    env.step(ids(tok, "<calc>626+562</calc>"))
    result = env.step(ids(tok, "<calc>1188</calc>"))  # the call's own number is not an answer
    assert result.episode_done and result.reward == 0.0
    result = env_of(tok, max_turns=1).step(ids(tok, "<calc>1+1</calc> 1188"))
    assert result.episode_done and result.reward == 1.0


def test_calculator_tasks_are_three_digit_additions():
    tasks = calculator_tasks("train", 20, seed=1)
    for task in tasks:
        a, b = task.info["expression"].split(" + ")
        assert 100 <= int(a) <= 999 and 100 <= int(b) <= 999 and task.answer == str(int(a) + int(b))
        assert task.system_prompt is None
    held_out = {t.info["expression"] for t in calculator_tasks("eval", 200)}
    assert not held_out & {t.info["expression"] for t in calculator_tasks("train", 500)}


def test_a_model_that_learnt_to_call_the_calculator_reads_its_result(tok):
    """A tiny model fitted to one tool-using conversation replays it through the engine:
    the calculator's reply is an observation (mask 0), the model's call and answer are actions."""
    model, _ = build_tiny_model(seed=0)
    factory = build_env_factory("calculator", {"max_tokens": 24}, tokenizer=tok)
    env = factory.group_builder(TASK, 1).make_envs()[0]
    prompt, _ = env.initial_observation()
    call, answer = ids(tok, "<calc>626+562</calc>"), ids(tok, "1188<|im_end|>")
    history = env.step(call).next_observation
    sequence = history + answer
    weights = torch.zeros(len(sequence))
    weights[len(prompt) : len(prompt) + len(call)] = 1
    weights[len(history) :] = 1
    tokens = torch.tensor([sequence])
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(300):
        per_token = torch.nn.functional.cross_entropy(model(tokens).logits[0, :-1], tokens[0, 1:], reduction="none")
        loss = (per_token * weights[1:]).sum() / weights.sum()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if loss.item() < 1e-3:
            break
    result = rollout_groups(
        [factory.group_builder(TASK, 2)],
        engine=NativeEngine(model.eval(), tok),
        seed=0,
        params=RolloutParams(greedy=True),
    )
    for row in group_experiences(result):
        assert row.tokens == sequence and row.reward == 1.0 and row.info["turns"] == 2
        expected = [0] * len(sequence)
        expected[len(prompt) : len(prompt) + len(call)] = [1] * len(call)
        expected[len(history) :] = [1] * len(answer)
        assert row.action_mask == expected[len(prompt) :]
        assert all(lp == 0.0 for lp, m in zip(row.logprobs, row.action_mask) if m == 0)
    assert result.metrics["env/correct"] == 1.0 and result.metrics["env/used_tool"] == 1.0
    assert result.metrics["env/tool_calls"] == 1.0 and result.metrics["rollout/turns/mean"] == 2.0
