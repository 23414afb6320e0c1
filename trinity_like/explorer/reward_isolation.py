"""``isolated``: any registered reward fn, each call in a forked child with memory, CPU and wall limits.

Registered in REWARD_FN as ``isolated`` (a built-in module: :mod:`trinity_like.builtins`). A reward
fn runs in the explorer's process by default (trusted code, docs/reliability.md): a call
that hangs is abandoned in a thread, one that allocates without bound takes the explorer
(and, on a shared machine, its neighbours) down. Wrapped in ``isolated``, each call runs
in a child forked from the explorer, which before calling the fn sets

- ``RLIMIT_AS`` to what the explorer had mapped at the fork plus ``memory_mb``: the fn may
  allocate that much more, then its allocations fail (``MemoryError``), the child reports
  the error and exits, and the explorer's own memory is untouched (the child's pages are
  copies-on-write of the explorer's and are freed with it). Memory the explorer's heap held
  free at the fork is mapped already, and often resident: the limit does not see the fn
  reuse it. So the child first gives those free pages up (glibc's ``malloc_trim``), and
  the parent watches its resident anonymous memory (``RssAnon``, every 10 ms), SIGKILLing
  it once that has grown by more than ``memory_mb`` (the same error, "(child killed)" added);
- ``RLIMIT_CPU`` to ``cpu_s`` seconds (then the kernel kills it);

and after ``wall_s`` wall seconds the parent SIGKILLs it. A call that fails any way (a
limit, an exception, a child killed from outside) raises here; the workflow's
:func:`~trinity_like.explorer.rewards.score_with_retries` then retries it and, when every
attempt failed, skips the task and counts it, as with a timeout. Each call gets a fresh
child, so nothing one call leaks or breaks reaches the next. Example::

    explorer:
      reward_fn: isolated
      reward_args: {fn: my_reward, args: {scale: 2}, memory_mb: 256, cpu_s: 5, wall_s: 8}

What it does not contain: the child is a fork of the explorer, so it reads everything the
explorer holds (it is isolation for trusted code that misbehaves, not a sandbox for
untrusted code: that is ``code_exec``). A fork copies only the calling thread: a reward fn
that needs a lock another explorer thread held at the fork (a logging lock, a torch thread
pool) waits for ever and is killed at ``wall_s``. A reward fn that runs a model (``reward_model``)
belongs in the explorer's process, unwrapped.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import math
import os
import resource
import select
import signal
import struct
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from trinity_like.errors import TrinityError
from trinity_like.experience import Task
from trinity_like.registry import REWARD_FN

_MB = 1024 * 1024


@dataclass(frozen=True)
class IsolatedParams:
    fn: str = ""  # REWARD_FN name of the reward fn each call runs in a child process
    args: Mapping[str, Any] = field(default_factory=dict)  # params of that reward fn
    memory_mb: int = 1024  # memory a call may allocate beyond what the explorer had mapped (RLIMIT_AS headroom)
    cpu_s: int = 10  # CPU seconds of a call (RLIMIT_CPU); then the kernel kills the child
    wall_s: float = 8.0  # wall seconds of a call before the child is SIGKILLed (keep < explorer.reward_timeout_s)

    def __post_init__(self) -> None:
        if not self.fn:
            raise TrinityError("isolated: fn is empty (the REWARD_FN name to run in a child process)")
        if self.memory_mb < 1 or self.cpu_s < 1 or self.wall_s <= 0:
            raise TrinityError(
                f"isolated: memory_mb and cpu_s must be >= 1 and wall_s > 0 "
                f"(got {self.memory_mb}, {self.cpu_s}, {self.wall_s})"
            )


class RewardProcessError(RuntimeError):
    """An isolated reward call failed in its child: a limit hit, an exception, or a killed child."""


def _status_bytes(pid: int | str, key: str) -> int | None:
    """``key`` (a size in kB) of ``/proc/PID/status`` in bytes; None when the process or the line is gone."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as f:
            return next((int(line.split()[1]) * 1024 for line in f if line.startswith(f"{key}:")), None)
    except OSError:  # a child that exited between two looks
        return None


def mapped_bytes() -> int:
    """This process's virtual memory size (``VmSize``), what ``RLIMIT_AS`` is compared with."""
    size = _status_bytes("self", "VmSize")
    if size is None:
        raise TrinityError("/proc/self/status has no VmSize line: isolated rewards need Linux")
    return size


def rss_anon_bytes(pid: int | str) -> int:
    """The resident anonymous memory (``RssAnon``) of process ``pid`` ("self": this one); 0 once it is gone."""
    return _status_bytes(pid, "RssAnon") or 0


@REWARD_FN.register_module("isolated")
class IsolatedReward:
    """The reward fn ``params.fn``, each call in a fresh forked child with memory, CPU and wall limits."""

    def __init__(self, *, params: IsolatedParams) -> None:
        from trinity_like.explorer.rewards import build_reward_fn

        if params.fn == "isolated":
            raise TrinityError("isolated: fn is 'isolated' itself; name the reward fn to run")
        try:
            self.fn = build_reward_fn(params.fn, params.args)  # built here, once: the children inherit it
        except TrinityError as exc:  # an unknown name, a bad arg: say where
            raise type(exc)(f"isolated.fn: {exc}") from None
        self.params = params

    def __call__(
        self,
        *,
        response: str,
        answer: str | None = None,
        task: Task | None = None,
        messages: list[dict[str, str]] | None = None,
    ) -> float:
        given = {"response": response, "answer": answer, "task": task, "messages": messages}
        return self.call({k: v for k, v in given.items() if v is not None})

    def call(self, inputs: Mapping[str, Any]) -> float:
        read_fd, write_fd = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: never returns into the explorer's code
            os.close(read_fd)
            _child(self.fn, inputs, write_fd, self.params)
        os.close(write_fd)
        raw: bytes | str = ""
        try:
            raw = _read_until(read_fd, time.monotonic() + self.params.wall_s, pid, self.params.memory_mb * _MB)
        finally:
            os.close(read_fd)
            status = _reap(pid, grace_s=1.0 if isinstance(raw, bytes) else 0.0)
        if raw == _WALL:
            raise RewardProcessError(
                f"{self.params.fn}: no result within wall_s={self.params.wall_s:g} s (child killed)"
            )
        if raw == _MEMORY:
            raise RewardProcessError(f"{self.params.fn}: {_memory_error(self.params)} (child killed)")
        if not raw:
            raise RewardProcessError(
                f"{self.params.fn}: the reward process died ({_describe(status)}) before answering"
            )
        ok, value = json.loads(raw)
        if not ok:
            raise RewardProcessError(f"{self.params.fn}: {value}")
        return float(value)


def _child(fn: Any, inputs: Mapping[str, Any], write_fd: int, params: IsolatedParams) -> None:
    """Give up the heap's free pages, write the resident anonymous memory left (the baseline of
    the parent's watch), set the limits, call ``fn``, write ``[ok, reward or error]`` as JSON, and ``_exit``.

    ``os._exit`` always: the child must not run the explorer's ``atexit`` handlers or flush
    its buffers (the parent owns them). MemoryError is caught like any error: the limit
    makes the fn's allocation fail, and there is room left to report it."""
    code = 0
    try:
        _release_free_heap()
        os.write(write_fd, struct.pack(_BASELINE, rss_anon_bytes("self")))
        limit = mapped_bytes() + params.memory_mb * _MB
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
        resource.setrlimit(resource.RLIMIT_CPU, (params.cpu_s, params.cpu_s + 1))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        try:
            value = fn(inputs)
            out = [True, value] if math.isfinite(value) else [False, f"non-finite reward {value!r}"]
        except MemoryError:
            out = [False, _memory_error(params)]
        except BaseException as exc:  # noqa: BLE001 -- reported to the parent, which counts it; never swallowed
            out = [False, f"{type(exc).__name__}: {exc}"]
        os.write(write_fd, json.dumps(out).encode())
    except BaseException:  # noqa: BLE001 -- even the report failed: the parent sees a child that died silently
        code = 1
    finally:
        os._exit(code)


def _memory_error(params: IsolatedParams) -> str:
    return f"MemoryError: allocated more than memory_mb={params.memory_mb} MB"


def _release_free_heap() -> None:
    """glibc: the pages of the heap's free blocks are given back (``malloc_trim(0)``; the parent's stay),
    so a reward fn reusing them faults in new pages that ``RssAnon`` counts. Elsewhere: nothing to do."""
    with contextlib.suppress(AttributeError):  # not glibc
        ctypes.CDLL(None).malloc_trim(0)


_BASELINE = "<Q"  # the child's first write: its RssAnon once the free heap is given up
_WALL, _MEMORY = "wall", "memory"  # why the parent stopped waiting for a child's answer


def _read_until(fd: int, deadline: float, pid: int, headroom: int) -> bytes | str:
    """What the child ``pid`` wrote to ``fd`` after its baseline, once it closes it; ``_WALL`` at
    ``deadline``, ``_MEMORY`` once its ``RssAnon`` is more than ``headroom`` bytes above the baseline."""
    got, size = bytearray(), struct.calcsize(_BASELINE)
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return _WALL
        if not select.select([fd], [], [], min(left, 0.01))[0]:
            if len(got) >= size and rss_anon_bytes(pid) > struct.unpack_from(_BASELINE, got)[0] + headroom:
                return _MEMORY
            continue
        chunk = os.read(fd, 65536)
        if not chunk:
            return bytes(got[size:])
        got += chunk


def _reap(pid: int, grace_s: float) -> int:
    """The child's exit status; after ``grace_s`` seconds (its pipe closed: it is exiting) it is SIGKILLed."""
    deadline = time.monotonic() + grace_s
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return status
        if time.monotonic() >= deadline:
            os.kill(pid, signal.SIGKILL)
            return os.waitpid(pid, 0)[1]
        time.sleep(0.005)


def _describe(status: int) -> str:
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        why = {signal.SIGXCPU: ": cpu_s exceeded", signal.SIGKILL: ": killed"}.get(sig, "")
        return f"signal {signal.Signals(sig).name}{why}"
    return f"exit status {os.WEXITSTATUS(status)}"
