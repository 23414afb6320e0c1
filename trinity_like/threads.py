"""Threads that share the machine: as many as the cores this process is given, and none
spinning on a core another process needs.

Two things made a run crawl beside other work on a laptop (a user saw a main-job-shaped step
take 258 s beside a CPU-bound process against 42 s with one thread; our measurement is in
docs/runs.md):

- **Spinning.** torch's CPU build runs its intra-op threads on GNU OpenMP, whose threads
  busy-wait at the end of each parallel region for the next one (``OMP_WAIT_POLICY`` unset:
  300,000 spins before they sleep). A decode step is a thousand small regions; when another
  process holds one of the cores, the thread that waits keeps spinning on the core the late
  one needs, and every region takes a scheduler slice. A run therefore sets
  ``GOMP_SPINCOUNT`` (:data:`SPINCOUNT`): a waiting thread spins briefly (bridging the
  microseconds between two regions of a quiet machine) and then sleeps.
- **Cores.** ``os.cpu_count()`` counts the machine, not what this process may use: a
  ``taskset``, a container's cpuset or a CPU quota give fewer. :func:`cores_given` reads the
  affinity mask and the cgroup quota, and the explorer and trainer threads are split over that.

These variables are read when OpenMP starts, which is when torch is first imported: the
command line sets them before any import of torch (:func:`apply`), and Ray's workers and the
run's child processes inherit them. A variable the user set is kept as it is. The run log
says what was chosen (:func:`describe`). Measured in ``benchmarks/threads.py``.
"""

from __future__ import annotations

import math
import os
import sys
from pathlib import Path

# Spins of a waiting OpenMP thread before it sleeps (libgomp's default is 300,000, ~0.1-1 ms
# of a core; 0 is OMP_WAIT_POLICY=PASSIVE). Measured in benchmarks/threads.py (docs/runs.md): as fast as
# the default quiet, a little faster beside a CPU-bound competitor; passive is 2x faster there but 1.4x
# slower quiet, so it is the user's choice (OMP_WAIT_POLICY=PASSIVE), not the default.
SPINCOUNT = 10_000
OWN = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")  # the user's choice of either wins
_chosen: dict[str, str] = {}  # what apply() set in this process, for describe()


def cores_given() -> int:
    """The cores this process may run on: its affinity mask, capped by a cgroup CPU quota."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        cores = os.cpu_count() or 1
    quota = _cgroup_quota()
    return max(1, min(cores, math.ceil(quota))) if quota else max(1, cores)


def _cgroup_quota() -> float | None:
    """cgroup v2 ``cpu.max`` (``quota period``, or ``max period``) of this process: CPUs, or None."""
    try:
        line = Path("/proc/self/cgroup").read_text().strip().splitlines()[0]
        group = line.split("::", 1)[1] if "::" in line else "/"
        text = (Path("/sys/fs/cgroup") / group.lstrip("/") / "cpu.max").read_text().split()
    except (OSError, IndexError):
        return None
    if len(text) != 2 or text[0] == "max":
        return None
    try:
        return int(text[0]) / int(text[1])
    except (ValueError, ZeroDivisionError):
        return None


def apply(environ: dict[str, str] | None = None) -> None:
    """Set the OpenMP wait policy for this process and every process it starts, unless the
    user chose one; call before torch is imported (afterwards it reaches children only)."""
    env = os.environ if environ is None else environ
    if any(name in env for name in OWN):
        return
    env["GOMP_SPINCOUNT"] = str(SPINCOUNT)
    _chosen["GOMP_SPINCOUNT"] = str(SPINCOUNT)
    _chosen["late"] = "1" if "torch" in sys.modules else ""


def describe(explorer: int, trainer: int, workers: int) -> str:
    """One line for the run log: the cores given, the threads of each side, the wait policy."""
    if "GOMP_SPINCOUNT" in _chosen:
        wait = f"OpenMP threads sleep after {SPINCOUNT:,} spins (GOMP_SPINCOUNT)"
        if _chosen.get("late"):
            wait += " -- in child processes only: torch was loaded before the run set it"
    else:
        own = ", ".join(f"{name}={os.environ[name]}" for name in OWN if name in os.environ)
        wait = f"OpenMP wait policy as set: {own}" if own else "OpenMP wait policy: library default"
    per = "" if workers == 1 else f" each of {workers} workers"
    return f"threads: {cores_given()} cores given; explorer {explorer}, trainer {trainer}{per}; {wait}"
