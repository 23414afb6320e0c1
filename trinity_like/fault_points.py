"""Named points where a test may SIGKILL this process or fail a write: fault injection into real runs.

``TRINITY_LIKE_FAULT=<point>:<n>`` acts the ``n``-th time the process reaches ``<point>``;
unset, :func:`reach` and :func:`write` only count. The kill points (:func:`reach`) SIGKILL
the process (no handler, no cleanup, no flush) where a kill is hardest to survive -- inside
a checkpoint write::

    before_weights    the checkpoint's temporary folder exists, nothing written in it
    after_weights     the weights are written, the optimiser state is not
    after_optimizer   weights and optimiser state are written, the manifest is not
    before_latest     the checkpoint folder is in place, the ``latest`` pointer still old
    after_latest      ``latest`` moved, the buffer has not yet marked the step consumed

The two inside the model folder are reached by the local engine's ``save``; verl's workers
write in their own processes, where the driver's kill would not reach.
``tests/faults/test_checkpoint_kill.py`` kills a run at each and resumes it. One point
lives in the verl workers (the engine passes the variable on to them;
``tests/faults/test_verl_worker_kill.py``)::

    verl_worker_update  the last rank of a verl worker group, between the forward and the
                        backward of its first micro-batch (once per forward_backward): the
                        other ranks are left waiting in FSDP's gradient collective
    explorer_run        the explorer, as it starts a batch (rollout or evaluation); in the
                        explorer actor (``explorer.placement: ray``) its death is restarted
                        by the run (``tests/faults/test_worker_restart.py``), in the driver
                        it is the run's

A process the run restarts counts afresh, so a fault armed for its n-th arrival would fire
again in each new process. ``TRINITY_LIKE_FAULT_ONCE=<file>`` makes the fault fire once
for the whole run: only in the process that creates ``<file>`` first.

The write points (:func:`write`) raise ``OSError(ENOSPC)`` -- what ``write(2)`` returns on
a full disk -- for the file about to be written, so the run's own handling of a full disk
is what a test sees (``tests/faults/test_disk_full.py``)::

    checkpoint_write  a checkpoint's weights (reached before each writer: model, then critic)
    buffer_write      a batch of rollouts going into the buffer (once per put)

Injecting here rather than filling a real filesystem: making a small one (tmpfs, a loop
device) needs root, which CI and users do not have, and a per-process file-size limit (RLIMIT_FSIZE) fails every file
past a size with EFBIG, not the one write a test means. SQLite's own "database or disk is
full" is produced for real in the unit tests with its page limit (``max_page_count``).
Nothing else reads the variable; an unknown point name is an error so a typo cannot test nothing.
"""

from __future__ import annotations

import errno
import os
import signal
from typing import Any

ENV_VAR = "TRINITY_LIKE_FAULT"
ONCE_VAR = "TRINITY_LIKE_FAULT_ONCE"  # a file: the fault fires only where it is created first
CHECKPOINT_POINTS = ("before_weights", "after_weights", "after_optimizer", "before_latest", "after_latest")
POINTS = (*CHECKPOINT_POINTS, "verl_worker_update", "explorer_run")  # every kill point
WRITE_POINTS = ("checkpoint_write", "buffer_write")

_seen: dict[str, int] = {}  # point -> times reached in this process


def _armed() -> tuple[str, int] | None:
    raw = os.environ.get(ENV_VAR, "")
    if not raw:
        return None
    point, _, n = raw.partition(":")
    if point not in POINTS + WRITE_POINTS or not n.isdigit() or int(n) < 1:
        raise ValueError(
            f"{ENV_VAR}={raw!r}: expected <point>:<n> with a point of {', '.join(POINTS + WRITE_POINTS)} and n >= 1"
        )
    return point, int(n)


def _arrive(point: str, known: tuple[str, ...]) -> bool:
    """Count one arrival at ``point``; True if the armed fault is this arrival (and, under
    ``TRINITY_LIKE_FAULT_ONCE``, has not fired in another process of the run yet)."""
    if point not in known:
        raise ValueError(f"unknown fault point {point!r} (known: {', '.join(known)})")
    _seen[point] = _seen.get(point, 0) + 1
    if _armed() != (point, _seen[point]):
        return False
    once = os.environ.get(ONCE_VAR)
    if not once:
        return True
    try:
        os.close(os.open(once, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return False
    return True


def env() -> dict[str, str]:
    """The fault variables set in this process, for the processes it starts through Ray: an
    actor gets the environment of the Ray that runs it, not of the caller (pass these in its
    ``runtime_env``'s ``env_vars``)."""
    return {k: os.environ[k] for k in (ENV_VAR, ONCE_VAR, WEIGHT_ENV_VAR) if os.environ.get(k)}


def reach(point: str) -> None:
    """Count one arrival at kill point ``point``; SIGKILL this process if the armed fault says so."""
    if _arrive(point, POINTS):
        os.kill(os.getpid(), signal.SIGKILL)


def write(point: str, path: str | os.PathLike) -> None:
    """Count one arrival at write point ``point`` about to write ``path``; raise the OSError a
    full disk gives (ENOSPC) if the armed fault says so."""
    if _arrive(point, WRITE_POINTS):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))


# -- weight-sync faults: what a rollout engine loads, spoiled (tests/faults/test_weight_identity.py) --
WEIGHT_ENV_VAR = "TRINITY_LIKE_WEIGHT_FAULT"
WEIGHT_FAULTS = ("drop", "all_but_one", "unmerged", "missed")
MISSED = object()  # arriving_weights' answer for "missed": the engine keeps its weights and its version
_loads = 0  # weight updates this process's rollout engines received
_spoils: bool | None = None  # under TRINITY_LIKE_FAULT_ONCE: whether this process is the one engine spoiled


def arriving_weights(state: dict, current: dict, base_folder: str | None) -> Any:
    """The weights a rollout engine's ``update_weights`` loads: ``state``, or -- when
    ``TRINITY_LIKE_WEIGHT_FAULT=<kind>:<n>`` is armed, from this process's ``n``-th update on --
    the silent sync failures that the weight identity (:mod:`trinity_like.models.weight_digest`)
    must catch, while the engine still takes the new version number:

    - ``drop``: None, nothing is loaded (an update lost on the way);
    - ``all_but_one``: the first tensor, in name order, whose value would change keeps the
      engine's value (a partial load that no missing key betrays; never one of a tied pair, whose other name would load it anyway);
    - ``unmerged``: the model folder's weights (``base_folder``) in place of those sent: what an engine samples with when a LoRA adapter is never merged;
    - ``missed``: :data:`MISSED` -- the update never reached this engine, which keeps its
      weights and its version number too (one engine of several that the sync skipped).

    With ``TRINITY_LIKE_FAULT_ONCE=<file>`` set too, only one process's engines are spoiled:
    the first to reach its ``n``-th update creates the file; every other process loads
    whole (the update applied to one engine of several, or to all but one).

    ``current``: the engine's state dict now. Unset, this returns ``state`` at the cost of a counter.
    """
    global _loads
    _loads += 1
    raw = os.environ.get(WEIGHT_ENV_VAR, "")
    if not raw:
        return state
    kind, _, n = raw.partition(":")
    if kind not in WEIGHT_FAULTS or not n.isdigit() or int(n) < 1:
        raise ValueError(f"{WEIGHT_ENV_VAR}={raw!r}: expected <kind>:<n> with a kind of {', '.join(WEIGHT_FAULTS)}")
    if _loads < int(n) or not _spoiled_here():
        return state
    if kind == "drop":
        return None
    if kind == "missed":
        return MISSED
    import torch

    if kind == "all_but_one":
        ptrs = [t.data_ptr() for t in current.values()]
        shared = {k for k, t in current.items() if ptrs.count(t.data_ptr()) > 1}  # tied: loading either sets both
        changed = [
            k
            for k in sorted(state)
            if k in current and k not in shared and not torch.equal(state[k].cpu(), current[k].cpu())
        ]
        return {**state, changed[0]: current[changed[0]].detach().clone()} if changed else state
    from pathlib import Path

    from safetensors.torch import load_file

    base: dict = {}
    for file in sorted(Path(str(base_folder)).glob("*.safetensors")):
        base.update(load_file(str(file)))
    return {k: base[k].to(v.dtype) for k, v in state.items() if k in base}  # a tied output follows its input


def _spoiled_here() -> bool:
    """Whether this process's engines are the ones spoiled: always, unless ``TRINITY_LIKE_FAULT_ONCE``
    names a file, which only the first process to get here creates (decided once per process)."""
    global _spoils
    once = os.environ.get(ONCE_VAR)
    if not once:
        return True
    if _spoils is None:
        try:
            os.close(os.open(once, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
            _spoils = True
        except FileExistsError:
            _spoils = False
    return _spoils
