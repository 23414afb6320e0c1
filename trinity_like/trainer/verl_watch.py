"""Calls into a verl worker group that notice a dead worker at once, not after a collective's timeout.

verl's worker groups answer a call with one Ray future per worker and, by default, wait
for them in rank order (``ray.get(list)``). When one worker dies mid-update (SIGKILL,
the OOM killer, a lost node) the others sit inside an FSDP collective waiting for it --
gloo's default timeout is 30 minutes, nccl's longer -- and a driver blocked on rank 0's
future hangs with them. Our worker methods are therefore registered non-blocking and the
driver waits with :func:`gather`: whichever future settles first is looked at first, and
a dead worker's settles as soon as Ray sees its process end (a second or so), so the run
raises :class:`~trinity_like.errors.WorkerDiedError` while the survivors are still stuck. The
engine's ``close`` then kills them, and the run builds the worker group again and resumes
from its latest checkpoint (:mod:`trinity_like.pipeline.restart`,
``tests/faults/test_verl_worker_kill.py``)::

    parts = gather(group.trinity_forward_backward(blocks, ...), "forward/backward", pids)
"""

from __future__ import annotations

from typing import Any

import ray
from ray.exceptions import RayActorError

from trinity_like.errors import WorkerDiedError

__all__ = ["WorkerDiedError", "gather"]


def gather(refs: list[Any], what: str, pids: list[int] | None = None) -> list[Any]:
    """The results of ``refs`` (one future per worker, in rank order), or
    :class:`WorkerDiedError` as soon as any worker's process is gone. An exception a worker
    raised (a bug, a bad batch) propagates unchanged, also as soon as it is known."""
    pending = list(refs)
    while pending:
        ready, pending = ray.wait(pending, num_returns=1)
        try:
            ray.get(ready[0])
        except RayActorError as exc:
            rank = refs.index(ready[0])
            pid = f" (pid {pids[rank]})" if pids else ""
            cause = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise WorkerDiedError(
                f"verl worker rank {rank} of {len(refs)}{pid} died during {what} ({cause})",
                "trainer",
                "the other workers were stopped",
            ) from None
    return ray.get(list(refs))
