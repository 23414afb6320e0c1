"""Named points where a test may SIGKILL this process: fault injection into real runs.

``TRINITY_LIKE_FAULT=<point>:<n>`` kills the process (SIGKILL: no handler, no cleanup, no
flush) the ``n``-th time it reaches ``<point>``; unset, :func:`reach` only counts. The points
sit where a kill is hardest to survive -- inside a checkpoint write::

    before_weights    the checkpoint's temporary folder exists, nothing written in it
    after_weights     the weights are written, the optimiser state is not
    after_optimizer   weights and optimiser state are written, the manifest is not
    before_latest     the checkpoint folder is in place, the ``latest`` pointer still old
    after_latest      ``latest`` moved, the buffer has not yet marked the step consumed

The two inside the model folder are reached by the local engine's ``save``; verl's workers
write in their own processes, where the driver's kill would not reach.
``tests/faults/test_checkpoint_kill.py`` kills a run at each and resumes it. Nothing else
reads the variable; an unknown point name is an error so a typo cannot test nothing.
"""

from __future__ import annotations

import os
import signal

ENV_VAR = "TRINITY_LIKE_FAULT"
POINTS = ("before_weights", "after_weights", "after_optimizer", "before_latest", "after_latest")

_seen: dict[str, int] = {}  # point -> times reached in this process


def _armed() -> tuple[str, int] | None:
    raw = os.environ.get(ENV_VAR, "")
    if not raw:
        return None
    point, _, n = raw.partition(":")
    if point not in POINTS or not n.isdigit() or int(n) < 1:
        raise ValueError(f"{ENV_VAR}={raw!r}: expected <point>:<n> with a point of {', '.join(POINTS)} and n >= 1")
    return point, int(n)


def reach(point: str) -> None:
    """Count one arrival at ``point``; SIGKILL this process if the armed fault says so."""
    if point not in POINTS:
        raise ValueError(f"unknown fault point {point!r} (known: {', '.join(POINTS)})")
    _seen[point] = _seen.get(point, 0) + 1
    armed = _armed()
    if armed == (point, _seen[point]):
        os.kill(os.getpid(), signal.SIGKILL)
