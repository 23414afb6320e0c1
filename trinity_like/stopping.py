"""A run stops when asked, and says what it kept.

``trinity-like run`` takes SIGINT (Ctrl-C) and SIGTERM (what ``kill``, schedulers and
container runtimes send) the same way:

- the first one raises :class:`StopRequested` in the main thread; the loop unwinds through
  its ``finally`` blocks -- the stage closes its engines, the explorer actor and the Ray it
  started -- and the command prints one line: the signal, the last checkpoint (the step a
  rerun resumes from) and the rows in the buffer, then exits with ``128 + signal``;
- a second one while it unwinds stops at once: every process this one started (Ray, its
  workers, a reward's child) is killed, then this process exits with the same status.

Either way nothing is left running: after the unwind the children that outlived it are
ended too (:func:`end_children`). Ray replaces the SIGTERM handler of the process that
calls ``ray.init`` with a bare ``sys.exit``; the places that start Ray call
:func:`reinstall` right after, so the handler holds for the whole run.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager, suppress

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class StopRequested(KeyboardInterrupt):
    """The run was asked to stop by ``signum``; a KeyboardInterrupt, so code that already
    treats Ctrl-C as "stop now" does the same for SIGTERM, and no ``except Exception`` swallows it."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum

    @property
    def exit_status(self) -> int:
        return 128 + self.signum


_state = {"installed": False, "received": 0}


def _handler(signum: int, frame: object) -> None:
    _state["received"] += 1
    if _state["received"] > 1:  # asked twice: no more unwinding
        sys.stderr.write(f"trinity-like: {signal.Signals(signum).name} again: stopping now\n")
        sys.stderr.flush()
        end_children(grace_s=0.0)
        os._exit(128 + signum)
    raise StopRequested(signum)


def was_stopped() -> bool:
    """Whether this process was asked to stop (a run returned early on a signal)."""
    return bool(_state["received"])


def exit_now(status: int) -> None:
    """End a stopped command-line run without the interpreter's teardown: Python resets the
    signal handlers to the defaults before its modules are torn down (seconds with torch
    loaded), and a second signal then would kill it with no status of ours. Nothing of the
    run is left to write: every file is closed by the unwind."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


def install() -> None:
    """Take SIGINT and SIGTERM for this run (main thread only; elsewhere Python cannot)."""
    if threading.current_thread() is not threading.main_thread():
        return
    for sig in SIGNALS:
        signal.signal(sig, _handler)
    _state["installed"] = True


@contextmanager
def taking_signals() -> Iterator[None]:
    """:func:`install` for the body; the handlers before it come back after (a run called
    from a test or a notebook leaves that process's Ctrl-C as it was)."""
    if threading.current_thread() is not threading.main_thread() or _state["installed"]:
        yield
        return
    before = {sig: signal.getsignal(sig) for sig in SIGNALS}
    _state["received"] = 0
    install()
    try:
        yield
    finally:
        if not _state["received"]:  # once asked to stop, a later signal still exits at once
            _state["installed"] = False
            for sig, handler in before.items():
                signal.signal(sig, handler)


def reinstall() -> None:
    """Take the signals back after a library replaced the handler (``ray.init``), if this
    process took them (:func:`install`); a no-op in tests and library use."""
    if _state["installed"]:
        install()


def end_children(grace_s: float = 3.0) -> list[int]:
    """End every process this one started that is still running (SIGTERM, then SIGKILL after
    ``grace_s``); returns their pids."""
    import psutil

    try:
        children = psutil.Process().children(recursive=True)
    except psutil.Error:
        return []
    for child in children:
        with suppress(psutil.Error):
            child.send_signal(signal.SIGTERM if grace_s > 0 else signal.SIGKILL)
    if grace_s > 0:
        _, alive = psutil.wait_procs(children, timeout=grace_s)
        for child in alive:
            with suppress(psutil.Error):
                child.kill()
        psutil.wait_procs(alive, timeout=grace_s)
    return [c.pid for c in children]
