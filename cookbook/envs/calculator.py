"""The ``calculator`` env: arithmetic with a calculator tool, over several turns.

The model is asked a problem ("What is 123 + 456?", 3-digit + 3-digit by default, or any
arithmetic task). In any turn but the last it may call the calculator by writing
``<calc>EXPRESSION</calc>`` -- integers, ``+ - * /`` and parentheses; sampling stops at
``</calc>``. The env evaluates the expression with its own small parser (never
``eval``), and answers in a message of ``tool_role`` ("123+456 = 579", or "1/0: error:
division by zero" -- a bad expression is an observation the model must cope with, never
a crash), which is appended to the token history under the chat template (token in,
token out: see :mod:`.chat`). A turn without a call is the answer: reward 1 if its last
number (outside any call) is right, else 0. The last allowed turn is always scored.

Without an example a small instruct model never calls the tool: SmolLM2-135M-Instruct on
64 held-out episodes (16 problems x 4, temperature 0.7) called it 0 % of the time and was
right 0 %; with the one worked example of ``EXAMPLE_CONVERSATION`` before the task (the
default), it called it 39 % of the time and was right 37.5 % -- a reward signal RL can
climb from. (One measurement, seed 0.)

Metrics (per episode, averaged over episodes): ``env/correct`` (accuracy),
``env/used_tool`` (rate of episodes that called the calculator), ``env/tool_calls``
(calls per episode), ``env/tool_errors``.

Example::

    factory = build_env_factory("calculator", {"max_turns": 3}, tokenizer=tok)
    dataset = TaskEnvDataset(calculator_tasks("train", 256), factory, batch_size=8, group_size=4)
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from trinity_like.envs.dataset import TaskGroupBuilder
from trinity_like.envs.types import Env, EnvFactory, EnvGroupBuilder, StepResult, StopCondition
from trinity_like.errors import TrinityError
from trinity_like.experience import Task
from trinity_like.explorer.rewards import exact_match
from trinity_like.explorer.tasks import ArithmeticParams, arithmetic_tasks
from trinity_like.models.chat import Message, message_tokens, render_prompt
from trinity_like.registry import ENV

CALCULATOR_SYSTEM_PROMPT = (
    "You can use a calculator. To use it, reply with <calc>EXPRESSION</calc>, for example <calc>12*34</calc>, "
    "and you will get the result. When you know the answer, reply with only the final number."
)
EXAMPLE_CONVERSATION = (
    {"role": "user", "content": "What is 215 + 468?"},
    {"role": "assistant", "content": "<calc>215+468</calc>"},
    {"role": "user", "content": "215+468 = 683"},
    {"role": "assistant", "content": "683"},
)
"""One worked example put before the task (``CalculatorParams.example``): the protocol shown once."""
CALCULATOR_TASKS = ArithmeticParams(ranges=((100, 999),), template="What is {expression}?")
"""3-digit + 3-digit problems, the calculator's default task."""

CALL = re.compile(r"<calc>(.*?)</calc>", re.S)
MAX_EXPRESSION_CHARS = 100  # longer expressions are an error observation (bounds the work)
MAX_DIGITS = 18  # per number


# -- the calculator -----------------------------------------------------------------------------------
class CalcError(ValueError):
    """An expression the calculator cannot evaluate; the message is what the model reads."""


_TOKEN = re.compile(r"\s*(?:(\d+)|([-+*/()]))")


def _tokens(expression: str) -> list[str]:
    text = expression.strip().removesuffix("=").rstrip()
    if not text:
        raise CalcError("empty expression")
    if len(text) > MAX_EXPRESSION_CHARS:
        raise CalcError(f"expression longer than {MAX_EXPRESSION_CHARS} characters")
    out, pos = [], 0
    while pos < len(text):
        match = _TOKEN.match(text, pos)
        if match is None:
            raise CalcError(f"unexpected character {text[pos:].lstrip()[0]!r}")
        number, op = match.groups()
        if number is not None and len(number) > MAX_DIGITS:
            raise CalcError(f"number longer than {MAX_DIGITS} digits")
        out.append(number if number is not None else op)
        pos = match.end()
    return out


class _Parser:
    """Recursive descent over ``expr := term (('+'|'-') term)*``, ``term := factor (('*'|'/') factor)*``,
    ``factor := ('+'|'-') factor | NUMBER | '(' expr ')'``: the usual precedence, exact fractions."""

    def __init__(self, tokens: list[str]) -> None:
        self.tokens = tokens
        self.pos = 0

    def peek(self) -> str:
        return self.tokens[self.pos] if self.pos < len(self.tokens) else ""

    def take(self) -> str:
        token = self.peek()
        if not token:
            raise CalcError("incomplete expression")
        self.pos += 1
        return token

    def expr(self) -> Fraction:
        value = self.term()
        while self.peek() in ("+", "-"):
            value = value + self.term() if self.take() == "+" else value - self.term()
        return value

    def term(self) -> Fraction:
        value = self.factor()
        while self.peek() in ("*", "/"):
            if self.take() == "*":
                value *= self.factor()
                continue
            divisor = self.factor()
            if divisor == 0:
                raise CalcError("division by zero")
            value /= divisor
        return value

    def factor(self) -> Fraction:
        token = self.take()
        if token in ("+", "-"):
            value = self.factor()
            return value if token == "+" else -value
        if token == "(":
            value = self.expr()
            if self.take() != ")":
                raise CalcError("missing ')'")
            return value
        if token.isdigit():
            return Fraction(int(token))
        raise CalcError(f"unexpected {token!r}")


def evaluate(expression: str) -> Fraction:
    """The exact value of an expression of integers, ``+ - * /`` and parentheses (a trailing
    ``=`` is allowed); :class:`CalcError` otherwise.

    >>> evaluate("123+456"), evaluate("2 * (3 + 4) - 10/4")
    (Fraction(579, 1), Fraction(23, 2))
    >>> evaluate("7/0")
    Traceback (most recent call last):
    ...
    cookbook.envs.calculator.CalcError: division by zero
    """
    parser = _Parser(_tokens(expression))
    value = parser.expr()
    if parser.peek():
        raise CalcError(f"unexpected {parser.peek()!r}")
    return value


def format_value(value: Fraction) -> str:
    """An integer as is; any other value with at most 6 decimals (``Fraction(5, 2)`` -> ``2.5``)."""
    if value.denominator == 1:
        return str(value.numerator)
    return f"{float(value):.6f}".rstrip("0").rstrip(".")


def calculator_reply(expression: str) -> tuple[str, bool]:
    """The calculator's message for one call, and whether it is an error.

    >>> calculator_reply(" 123+456 ")
    ('123+456 = 579', False)
    >>> calculator_reply("12*/3")
    ("12*/3: error: unexpected '/'", True)
    """
    expression = expression.strip()
    try:
        return f"{expression} = {format_value(evaluate(expression))}", False
    except CalcError as exc:
        return f"{expression}: error: {exc}", True


# -- the env -----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class CalculatorParams:
    """The tool's prompt and the episode's limits."""

    system_prompt: str = CALCULATOR_SYSTEM_PROMPT  # replaces the task's system prompt; "" keeps the task's
    example: bool = True  # put EXAMPLE_CONVERSATION (a call, its result, the answer) before the task
    max_turns: int = 3  # actions per episode, the answer included; the last one is always scored
    max_tokens: int = 48  # most tokens of one action
    tool_role: str = "user"  # role of the calculator's messages ("tool" where the chat template knows it)

    def __post_init__(self) -> None:
        if self.max_turns < 1:
            raise TrinityError(f"CalculatorParams.max_turns must be >= 1, got {self.max_turns}")
        if not self.tool_role:
            raise TrinityError("CalculatorParams.tool_role must be a role name, got ''")
        StopCondition(max_tokens=self.max_tokens)


class CalculatorEnv(Env):
    """One problem; the model may call the calculator before it answers."""

    metric_names = (
        "correct",
        "used_tool",
        "tool_calls",
        "tool_errors",
    )  # env/tool_calls is 0, not absent, without calls

    def __init__(
        self, *, task: Task, messages: list[Message], prompt: list[int], tokenizer: Any, params: CalculatorParams
    ) -> None:
        self.task = task
        self.messages = list(messages)  # the conversation so far, for the chat template's context
        self.history = list(prompt)  # every token so far; only ever appended to
        self.tokenizer = tokenizer
        self.params = params
        self.stop = StopCondition(max_tokens=params.max_tokens, stop_strings=("</calc>",))
        self.turns = 0
        self.calls = 0

    def initial_observation(self) -> tuple[list[int], StopCondition]:
        return list(self.history), self.stop

    def step(self, action_tokens: list[int]) -> StepResult:
        self.turns += 1
        text = self.tokenizer.decode(action_tokens, skip_special_tokens=True)
        calls = CALL.findall(text)
        if calls and self.turns < self.params.max_turns:
            self.calls += 1
            reply, failed = calculator_reply(calls[-1])
            tool = {"role": self.params.tool_role, "content": reply}
            delta = message_tokens(self.tokenizer, self.messages, [tool], action_tokens=action_tokens)
            self.messages += [{"role": "assistant", "content": text}, tool]
            self.history += list(action_tokens) + delta
            metrics = {"tool_calls": 1.0, "tool_errors": float(failed)}
            return StepResult(0.0, False, list(self.history), self.stop, metrics)
        reward = exact_match(response=CALL.sub(" ", text), answer=self.task.answer)
        return StepResult(reward, True, [], self.stop, {"correct": reward, "used_tool": float(self.calls > 0)})


@ENV.register_module("calculator")
class CalculatorEnvs(EnvFactory):
    """Arithmetic with a calculator tool: <calc>123+456</calc> gets its value back, then the model answers."""

    def __init__(self, *, tokenizer: Any, params: CalculatorParams) -> None:
        self.tokenizer = tokenizer
        self.params = params

    def group_builder(self, task: Task, group_size: int) -> EnvGroupBuilder:
        messages = task.messages()
        system = [m for m in messages if m["role"] == "system"]
        if self.params.system_prompt:
            system = [{"role": "system", "content": self.params.system_prompt}]
        example = [dict(m) for m in EXAMPLE_CONVERSATION] if self.params.example else []
        messages = system + example + [m for m in messages if m["role"] != "system"]
        prompt = render_prompt(self.tokenizer, messages)  # once per group: the envs share it

        def make_env() -> Env:
            return CalculatorEnv(
                task=task, messages=messages, prompt=prompt, tokenizer=self.tokenizer, params=self.params
            )

        return TaskGroupBuilder(task, group_size, make_env)


def calculator_tasks(
    split: str, count: int | None, *, seed: int = 0, params: ArithmeticParams = CALCULATOR_TASKS
) -> list[Task]:
    """The first ``count`` problems of ``split`` (3-digit + 3-digit by default), without a
    system prompt: the env brings its own."""
    return arithmetic_tasks(params, split, count, seed=seed, system_prompt="")
