"""Built-in reward functions (the REWARD_FN registry) and how workflows call them safely.

The contract: a reward function declares its inputs as keyword-only parameters, taken
from ``response`` (the decoded response text), ``answer`` (the task's reference answer),
``task`` (the whole :class:`~trinity_like.experience.Task`) and ``messages`` (the chat
prompt), plus an optional ``params`` frozen dataclass; it returns a float. A class is
registered the same way: built once with ``params``, its instances are called with the
inputs (``reward_model`` loads a model that way). Example::

    @REWARD_FN.register_module("length_penalty")
    def length_penalty(*, response: str, params: LengthParams) -> float:
        \"\"\"Minus the response length in characters, scaled.\"\"\"
        return -params.scale * len(response)

Reward code is user code and may hang, raise, or return NaN, None or a string:
:func:`score_with_retries` runs each call with a time limit and retries, and reports a
failure instead of stopping the explorer (the workflow then skips the task and counts it).
These functions run in the explorer's process: they are code you installed or named
(trusted), and one that allocates without bound is not contained there; wrapped in the
``isolated`` reward (:mod:`trinity_like.explorer.reward_isolation`) each call runs in a
forked child whose allocations beyond ``memory_mb`` fail. Code the *model* wrote
runs only in a sandboxed child process with CPU, memory, wall-time and network limits:
the ``code_exec`` reward (:mod:`trinity_like.explorer.code_exec`; trust model in
docs/reliability.md).
"""

from __future__ import annotations

import inspect
import logging
import math
import queue
import re
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from trinity_like.components import build_params, call_component
from trinity_like.errors import TrinityError
from trinity_like.experience import Task
from trinity_like.explorer.code_exec import CodeExecReward
from trinity_like.registry import REWARD_FN

RewardCall = Callable[[Mapping[str, Any]], float]


# -- answer parsing -------------------------------------------------------------------------
_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?|-?\.\d+")


def last_boxed(text: str) -> str | None:
    r"""Content of the last ``\boxed{...}`` (braces balanced), or None."""
    start = text.rfind("\\boxed")
    if start < 0:
        return None
    i = text.find("{", start)
    if i < 0:
        return None
    depth = 0
    for j in range(i, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return text[i + 1 : j].strip()
    return None


def last_number(text: str) -> str | None:
    """The last number in ``text`` with thousands separators removed (``1,234`` -> ``1234``)."""
    found = _NUMBER.findall(text)
    return found[-1].replace(",", "") if found else None


def parse_final_answer(text: str) -> str | None:
    r"""The final answer of a response: the last ``\boxed{}`` if any, else the last number.

    A boxed number is normalised like any number (``\boxed{1,234}`` -> ``1234``); other
    boxed content (``\frac{1}{2}``) is returned as written, for exact comparison.
    """
    boxed = last_boxed(text)
    if boxed is not None:
        boxed = boxed.strip("$ ")
        return boxed.replace(",", "") if _NUMBER.fullmatch(boxed) else boxed
    return last_number(text)


def _same(a: str, b: str) -> bool:
    """Numbers compare by value (``12.0`` equals ``12``), anything else as stripped text."""
    try:
        return math.isclose(float(a), float(b), rel_tol=0.0, abs_tol=1e-9)
    except ValueError:
        return a.strip() == b.strip()


# -- registered reward functions ----------------------------------------------------------------
def exact_match_reference(answer: str) -> str:
    r"""What ``exact_match`` compares a response's final answer with: the reference's own final
    answer (its last ``\boxed{}``, else its last number, so ``"...\n#### 1,234"`` gives ``1234``),
    else the whole reference stripped (a reference with no number: ``"Paris"``)."""
    return parse_final_answer(answer) or answer.strip()


@REWARD_FN.register_module("exact_match")
def exact_match(*, response: str, answer: str) -> float:
    r"""1.0 if the response's final answer (last \boxed{} or last number) equals the reference's
    (:func:`exact_match_reference`); numbers compare by value (``12.0`` equals ``12``)."""
    got = parse_final_answer(response)
    return 1.0 if got is not None and _same(got, exact_match_reference(answer)) else 0.0


# What evals.jsonl, the plan and the viewer show as compared: declared on the fn, read with getattr.
exact_match.reference_of = exact_match_reference  # type: ignore[attr-defined]
exact_match.response_of = parse_final_answer  # type: ignore[attr-defined]


# math-verify warns on every call that its own signal-based timeout is off; ours replaces it
# (signals only work in the main thread, and rewards run in worker threads).
logging.getLogger("math_verify").setLevel(logging.ERROR)


@REWARD_FN.register_module("math_verify")
def math_verify_reward(*, response: str, answer: str) -> float:
    """1.0 if math-verify finds the response mathematically equal to the reference (LaTeX, boxed, numeric)."""
    from math_verify import parse, verify

    # A bare reference ("42", "\\sqrt{8}") is read as LaTeX math.
    gold = parse(answer if "$" in answer or "\\boxed" in answer else f"${answer}$", parsing_timeout=None)
    pred = parse(response, parsing_timeout=None)
    if not gold or not pred:
        return 0.0
    return 1.0 if verify(gold, pred, timeout_seconds=None) else 0.0


@dataclass(frozen=True)
class FormatParams:
    pattern: str = r"-?\d+(?:\.\d+)?"  # the whole stripped response must match (default: one number)
    reward: float = 1.0  # given when it matches
    penalty: float = 0.0  # given when it does not


@REWARD_FN.register_module("format")
def format_reward(*, response: str, params: FormatParams) -> float:
    """params.reward if the whole stripped response matches params.pattern, else params.penalty."""
    return params.reward if re.fullmatch(params.pattern, response.strip(), flags=re.DOTALL) else params.penalty


@dataclass(frozen=True)
class RewardModelParams:
    path: str = ""  # folder written by trinity_like.models.reward_model.save_reward_model
    max_length: int = 2048  # prompt + response tokens kept (the end is kept)


@REWARD_FN.register_module("reward_model")
class RewardModelReward:
    """Score of a trained Bradley-Terry reward model on the prompt and response."""

    def __init__(self, *, params: RewardModelParams) -> None:
        from trinity_like.models.reward_model import load_reward_model

        self.model, self.tokenizer = load_reward_model(params.path)
        self.params = params

    def __call__(self, *, messages: list[dict[str, str]], response: str) -> float:
        from trinity_like.models.reward_model import score_conversations

        conversation = [*messages, {"role": "assistant", "content": response}]
        return float(score_conversations(self.model, self.tokenizer, [conversation], self.params.max_length)[0])


@REWARD_FN.register_module("reasoning_gym")
def reasoning_gym_reward(*, response: str, task: Task) -> float:
    """reasoning-gym's own scorer for the task's generator (needs the optional reasoning-gym)."""
    from trinity_like.explorer.tasks import load_reasoning_gym

    entry = task.info.get("entry")
    if entry is None:
        raise TrinityError(f"task {task.task_id!r} has no reasoning-gym entry in info['entry']")
    dataset = entry.get("metadata", {}).get("source_dataset") or task.info.get("dataset")
    score = load_reasoning_gym().get_score_answer_fn(dataset)
    # Its scorers compare the bare answer; a boxed answer is unwrapped first.
    return float(score(last_boxed(response) or response.strip(), entry))


REWARD_FN.register_module("code_exec", module=CodeExecReward)  # unit tests of the model's code, sandboxed


# -- calling reward functions ---------------------------------------------------------------------
class RewardTypeError(TypeError):
    """A reward function returned something that is not a number (None, a string, a list)."""


def as_reward(value: Any, name: str) -> float:
    """``value`` as a float: a number (bool, int, float, a NumPy scalar, a one-element tensor).

    ``None`` or a string is an error rather than a silent 0 or a parsed ``"1.0"``: such a
    return is a bug in the reward code, and the caller counts the task as skipped.
    """
    if value is None or isinstance(value, (str, bytes)):
        raise RewardTypeError(f"reward function {name!r} returned {type(value).__name__} {value!r:.60}, not a number")
    try:
        return float(value)
    except (TypeError, ValueError, RuntimeError):  # a list, a dict, a tensor of several values
        raise RewardTypeError(f"reward function {name!r} returned {type(value).__name__}, not a number") from None


def build_reward_fn(name: str, values: Mapping[str, Any] | None = None) -> RewardCall:
    """The REWARD_FN entry ``name`` as a callable on an inputs mapping; params validated now."""
    component = REWARD_FN.get(name)
    params = build_params(component, values, where=f"reward_fn.{name}")
    if inspect.isclass(component):
        instance = component(params=params) if params is not None else component()
        return lambda inputs: as_reward(call_component(instance, inputs), name)
    return lambda inputs: as_reward(call_component(component, inputs, params), name)


@dataclass(frozen=True)
class RewardOutcome:
    """What one scored response got: a reward, or why there is none."""

    reward: float | None  # None when every attempt failed
    error: str = ""  # "timeout" or "<ExceptionType>: message" of the last attempt
    attempts: int = 1


class DeadlineExceeded(TimeoutError):
    """A call run by :func:`call_with_deadline` went past its time limit (not a TimeoutError
    the called code raised itself: callers that must tell them apart catch this class)."""


STARVED_FACTOR = 100  # a call is cut after this many times its limit of wall time, however much of it was starved


def _run_delay(tid: int) -> float | None:
    """Seconds thread ``tid`` of this process has waited on a run queue (runnable, not running):
    the time a loaded machine took from it. None when unknown (the thread ended, no schedstat)."""
    try:
        with open(f"/proc/self/task/{tid}/schedstat", "rb") as fh:
            return int(fh.read().split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return None


def call_with_deadline(fn: Callable[[], Any], timeout_s: float, *, what: str, unstarved: bool = False) -> Any:
    """``fn()`` in a daemon thread; :class:`DeadlineExceeded` after ``timeout_s``.

    Python cannot kill a thread: a call that hangs keeps its thread until it returns, but
    the caller stops waiting for it and the process can still exit. ``what`` names the
    call in the error and the thread (``"reward function"``, ``"env call"``).

    With ``unstarved`` the time charged to the call leaves out the time its thread waited on
    a run queue for a CPU (Linux's per-thread schedstat): the wall time it computed or waited
    for something (sleep, I/O, a lock), which is the same on a quiet and a loaded machine, so
    whether a call is cut does not depend on the load -- decided alike for a call still
    running and one that has returned. With a wall-time limit a reward that computes 0.1 s of
    its 0.25 s was cut on a core shared with 3 busy processes (every task of the step skipped)
    and not on a quiet one (tests/faults/test_load_determinism.py). A call is cut in any case
    after ``STARVED_FACTOR * timeout_s`` of wall time.
    """
    box: queue.Queue[tuple[bool, Any, float | None]] = queue.Queue(maxsize=1)
    began: list[tuple[int, float, float | None]] = []  # (thread id, wall, run-queue wait) when the call began

    def charged() -> float | None:
        """Seconds charged to the call so far: wall time less its run-queue wait (None: unknown)."""
        tid, wall0, delay0 = began[0]
        delay = _run_delay(tid)
        return None if delay is None or delay0 is None else time.monotonic() - wall0 - (delay - delay0)

    def target() -> None:
        if unstarved:
            tid = threading.get_native_id()
            began.append((tid, time.monotonic(), _run_delay(tid)))
        try:
            value = fn()
        except BaseException as exc:  # noqa: BLE001 -- delivered to the caller below, never swallowed here
            box.put((False, exc, charged() if unstarved else None))
        else:
            box.put((True, value, charged() if unstarved else None))

    threading.Thread(target=target, daemon=True, name=what).start()
    try:
        ok, value, spent = box.get(timeout=timeout_s) if not unstarved else _wait_unstarved(box, charged, timeout_s)
    except queue.Empty:
        raise DeadlineExceeded(f"{what} exceeded {timeout_s:g} s") from None
    if spent is not None and spent > timeout_s:  # it returned, but past its time: cut, as if seen running
        raise DeadlineExceeded(f"{what} exceeded {timeout_s:g} s")
    if not ok:
        raise value
    return value


def _wait_unstarved(box: queue.Queue, charged: Callable[[], float | None], timeout_s: float) -> tuple:
    """The call's result, while the time charged to it stays within ``timeout_s`` (wall time once
    that is unknown) and for at most ``STARVED_FACTOR * timeout_s`` of wall time; else queue.Empty."""
    t0 = time.monotonic()
    while True:
        try:
            return box.get(timeout=min(0.05, timeout_s / 4))
        except queue.Empty:
            pass
        wall = time.monotonic() - t0
        try:
            spent = charged()
        except IndexError:  # the thread has not begun: all of it was starved so far
            spent = 0.0
        if spent is None:  # no schedstat, or the thread just ended (its result is in the box)
            spent = wall if box.empty() else 0.0
        if spent > timeout_s or wall > STARVED_FACTOR * timeout_s:
            raise queue.Empty


def score_with_retries(fn: RewardCall, inputs: Mapping[str, Any], *, retries: int, timeout_s: float) -> RewardOutcome:
    """Score once, retrying up to ``retries`` more times after an error or a timeout.

    This is the one place that catches every ``Exception``: reward functions are user
    code, and one bad task must not end a run. The failure is not hidden -- it comes
    back as an outcome with the error text, and the workflow records and counts it.
    """
    error = ""
    for attempt in range(1, retries + 2):
        try:
            value = call_with_deadline(lambda: fn(inputs), timeout_s, what="reward function", unstarved=True)
        except TimeoutError:
            error = "timeout"
            continue
        except Exception as exc:  # noqa: BLE001 -- see the docstring
            error = f"{type(exc).__name__}: {exc}"
            continue
        if not math.isfinite(value):
            error = f"non-finite reward {value!r}"
            continue
        return RewardOutcome(value, "", attempt)
    return RewardOutcome(None, error, retries + 1)
