"""Calling env code safely: a time limit per call, retries, and failures counted, not hidden.

An env is user code -- a tool server that is down, a game engine that hangs, a bug on a
rare input. One bad episode must not end a training run, and it must not pass unnoticed
either: :func:`call_env` returns the failure's text, the rollout drops the episode's group
with that reason (:class:`DroppedGroup`) and counts it in its metrics; a loop shows each
distinct failure once (:class:`DropNotices`) and stops when most groups of a step were
dropped (:func:`check_dropped`): a broken env then ends the run with its error instead
of training on nothing.

Example::

    counts = EnvCalls()
    value, error = call_env(lambda: env.step(action), timeout_s=60, retries=1, counts=counts)
    if error:   # "timeout after 60 s" or "ValueError: ..."
        ...
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from trinity_like.errors import TrinityError
from trinity_like.explorer.rewards import DeadlineExceeded, call_with_deadline


@dataclass
class EnvCalls:
    """Counts of env calls that went wrong, for the metrics."""

    errors: int = 0  # attempts that raised
    retries: int = 0  # attempts after the first
    timeouts: int = 0  # calls that ran past their time limit
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)  # steps run in threads

    def add(self, name: str) -> None:
        with self.lock:
            setattr(self, name, getattr(self, name) + 1)


def call_env(fn: Callable[[], Any], *, timeout_s: float, retries: int, counts: EnvCalls) -> tuple[Any, str]:
    """``(fn(), "")``, or ``(None, why)`` once every attempt failed.

    A call that raises is tried again, up to ``retries`` more times. A call past
    ``timeout_s`` is not: it still runs in its thread and holds the env, so a second call
    would race it. A :class:`TrinityError` is a usage error (a bad config, a broken
    contract) that no retry can fix, and passes through.

    This is the one place that catches every ``Exception`` raised by env code; see the
    module docstring for why that hides nothing.
    """
    error = ""
    for attempt in range(retries + 1):
        if attempt:
            counts.add("retries")
        try:
            return call_with_deadline(fn, timeout_s, what="env call"), ""
        except TrinityError:
            raise
        except DeadlineExceeded:
            counts.add("timeouts")
            return None, f"timeout after {timeout_s:g} s"
        except Exception as exc:  # noqa: BLE001 -- see the docstring
            counts.add("errors")
            error = one_line(exc)
    return None, error


def one_line(exc: BaseException, limit: int = 300) -> str:
    """``"ValueError: the message"`` on one line (whitespace runs folded), cut to ``limit`` characters.

    >>> one_line(ValueError("tool server\\n  unreachable"))
    'ValueError: tool server unreachable'
    """
    text = " ".join(f"{type(exc).__name__}: {exc}".split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


# -- dropped groups ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class DroppedGroup:
    """A group that produced no episodes, and why."""

    index: int  # position of its builder in the rollout call
    reason: str  # where and what, e.g. "MyEnv (group 3, env 1) step at turn 2: ValueError: ..."
    env: str = ""  # the failing env's class name
    error: str = ""  # what failed, on one line: "ValueError: ...", "timeout after 60 s"


class DropNotices:
    """Writes each distinct failure (env class, error) once: the first group it drops says why, the
    rest are only counted (``rollout/dropped_groups``), so a flaky env does not flood the log.

    >>> notes = DropNotices(print)
    >>> notes("iteration 1", [DroppedGroup(0, "Calc (group 0, env 1) step at turn 0: ValueError: down", "Calc",
    ...                                     "ValueError: down")] * 2)
    iteration 1: env Calc dropped a group: ValueError: down (Calc (group 0, env 1) step at turn 0; shown once, counted in rollout/dropped_groups)
    >>> notes("iteration 2", [DroppedGroup(3, "...", "Calc", "ValueError: down")])
    """

    def __init__(self, write: Callable[[str], None]) -> None:
        self.write = write
        self.seen: set[tuple[str, str]] = set()

    def __call__(self, where: str, dropped: Sequence[DroppedGroup]) -> None:
        for d in dropped:
            if (d.env, d.error) in self.seen:
                continue
            self.seen.add((d.env, d.error))
            at = d.reason.removesuffix(f": {d.error}")
            self.write(
                f"{where}: env {d.env} dropped a group: {d.error} ({at}; shown once, counted in rollout/dropped_groups)"
            )


def check_dropped(dropped: int, groups: int, first_reason: str, *, max_fraction: float, where: str, knob: str) -> None:
    """Stop with a one-line :class:`TrinityError` when more than ``max_fraction`` of a step's
    ``groups`` were dropped; ``first_reason`` (the first drop's) names the cause, ``knob`` the
    setting that allows more.

    >>> check_dropped(1, 2, "x", max_fraction=0.5, where="step 1", knob="max_dropped_fraction")
    >>> check_dropped(2, 2, "Calc (group 0, env 0) step at turn 0: ValueError: down", max_fraction=0.5,
    ...               where="step 1", knob="max_dropped_fraction")
    Traceback (most recent call last):
    ...
    trinity_like.errors.TrinityError: step 1: 2 of 2 groups were dropped, more than max_dropped_fraction=0.5 allows; the first: Calc (group 0, env 0) step at turn 0: ValueError: down
    """
    if groups > 0 and dropped / groups > max_fraction:
        raise TrinityError(
            f"{where}: {dropped} of {groups} groups were dropped, more than {knob}={max_fraction:g} allows; "
            f"the first: {first_reason}"
        )


def check_fraction(value: float, what: str) -> None:
    """``value`` must be a fraction in [0, 1] (a one-line TrinityError naming ``what`` otherwise)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1:
        raise TrinityError(f"{what} must be a fraction in [0, 1], got {value!r}")
