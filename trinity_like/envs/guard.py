"""Calling env code safely: a time limit per call, retries, and failures counted, not hidden.

An env is user code -- a tool server that is down, a game engine that hangs, a bug on a
rare input. One bad episode must not end a training run, and it must not pass unnoticed
either: :func:`call_env` returns the failure's text, the rollout drops the episode's group
with that reason and counts it in its metrics.

Example::

    counts = EnvCalls()
    value, error = call_env(lambda: env.step(action), timeout_s=60, retries=1, counts=counts)
    if error:   # "timeout after 60 s" or "ValueError: ..."
        ...
"""

from __future__ import annotations

import threading
from collections.abc import Callable
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
            error = f"{type(exc).__name__}: {exc}"
    return None, error
