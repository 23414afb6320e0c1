"""Threads that share the machine: as many as the cores this process is given, and none
spinning on a core another process needs.

Two things made a run crawl beside other work on a laptop (a user saw a main-job-shaped step
take 258 s beside a CPU-bound process against 42 s with one thread; our measurement is in
docs/runs.md):

- **Spinning.** torch's CPU build runs its intra-op threads on GNU OpenMP, whose threads
  busy-wait at the end of each parallel region for the next one (``OMP_WAIT_POLICY`` unset:
  300,000 spins before they sleep). A decode step is a thousand small regions; when another
  process holds one of the cores, the thread that waits keeps spinning on the core the late
  one needs, and every region takes a scheduler slice. Sleeping at once (passive) fixes that
  but costs a wake-up per region on a quiet machine. So a run looks before it chooses
  (:func:`others_busy`: the cores other processes kept busy over a short window): on a busy
  machine its threads sleep at once (``OMP_WAIT_POLICY=PASSIVE``); on a quiet one they spin
  briefly (``GOMP_SPINCOUNT`` = :data:`SPINCOUNT`, bridging the microseconds between two
  regions) and then sleep.
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
import time
from collections.abc import Callable
from pathlib import Path

# Spins of a waiting OpenMP thread before it sleeps (libgomp's default is 300,000, ~0.1-1 ms
# of a core; 0 is OMP_WAIT_POLICY=PASSIVE). Measured in benchmarks/threads.py (docs/runs.md): as fast as
# the default quiet, a little faster beside a CPU-bound competitor; passive is 2x faster there but 1.4x
# slower quiet, so it is the user's choice (OMP_WAIT_POLICY=PASSIVE), not the default.
SPINCOUNT = 10_000
# Cores that other processes kept busy, over the run's cores, at or above which the machine counts as
# busy and the run's threads sleep at once (passive). Half a core: a competitor that holds one of two
# cores half the time already makes spinning threads wait on it (benchmarks/threads.py, docs/runs.md).
BUSY_CORES = 0.5
LOOK_S = 0.25  # how long apply() watches the machine before torch loads
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


def _busy_jiffies(cores: set[int]) -> tuple[int, int]:
    """(busy, total) clock ticks of ``cores`` since boot, from ``/proc/stat``'s ``cpuN`` lines."""
    busy = total = 0
    for line in Path("/proc/stat").read_text().splitlines():
        name, *fields = line.split()
        if not name.startswith("cpu") or name == "cpu" or int(name[3:]) not in cores:
            continue
        ticks = [int(f) for f in fields[:8]]  # user nice system idle iowait irq softirq steal
        total += sum(ticks)
        busy += sum(ticks) - ticks[3] - ticks[4]
    return busy, total


def _own_jiffies() -> int:
    """Clock ticks this process (and its reaped children) has run, from ``/proc/self/stat``."""
    fields = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
    return sum(int(f) for f in fields[11:15])  # utime stime cutime cstime


def others_busy(window: float = LOOK_S) -> float | None:
    """Cores of this process's set that *other* processes kept busy over ``window`` seconds
    (0.0 on an idle machine, up to :func:`cores_given`), or None where ``/proc`` cannot tell."""
    try:
        cores = os.sched_getaffinity(0)
        busy0, total0 = _busy_jiffies(cores)
        own0 = _own_jiffies()
        time.sleep(window)
        busy1, total1 = _busy_jiffies(cores)
        own1 = _own_jiffies()
    except (AttributeError, OSError, ValueError, IndexError):
        return None
    if total1 <= total0:
        return None
    share = max(0, (busy1 - busy0) - (own1 - own0)) / (total1 - total0)
    return round(share * len(cores), 2)


def choose(busy: float | None) -> dict[str, str]:
    """The OpenMP variables for a machine whose other processes keep ``busy`` cores busy."""
    if busy is not None and busy >= BUSY_CORES:
        return {"OMP_WAIT_POLICY": "PASSIVE"}
    return {"GOMP_SPINCOUNT": str(SPINCOUNT)}


def apply(environ: dict[str, str] | None = None, *, look: Callable[[], float | None] = others_busy) -> None:
    """Set the OpenMP wait policy for this process and every process it starts, unless the
    user chose one, from how busy ``look`` finds the machine; call before torch is imported
    (afterwards it reaches children only)."""
    env = os.environ if environ is None else environ
    if any(name in env for name in OWN):
        return
    busy = look()
    chosen = choose(busy)
    env.update(chosen)
    _chosen.clear()
    _chosen.update(chosen)
    _chosen["busy"] = "" if busy is None else f"{busy:.1f}"
    _chosen["late"] = "1" if "torch" in sys.modules else ""


def describe(explorer: int, trainer: int, workers: int) -> str:
    """One line for the run log: the cores given, the threads of each side, the wait policy."""
    if "GOMP_SPINCOUNT" in _chosen or "OMP_WAIT_POLICY" in _chosen:
        seen = f"machine busy at start ({_chosen['busy']} cores used by others)"
        if "OMP_WAIT_POLICY" in _chosen:
            wait = f"{seen}: OpenMP threads sleep at once (OMP_WAIT_POLICY=PASSIVE)"
        else:
            quiet = f"quiet at start ({_chosen['busy']} cores used by others)" if _chosen["busy"] else "load unknown"
            wait = f"{quiet}: OpenMP threads sleep after {SPINCOUNT:,} spins (GOMP_SPINCOUNT)"
        if _chosen.get("late"):
            wait += " -- in child processes only: torch was loaded before the run set it"
    else:
        own = ", ".join(f"{name}={os.environ[name]}" for name in OWN if name in os.environ)
        wait = f"OpenMP wait policy as set: {own}" if own else "OpenMP wait policy: library default"
    per = "" if workers == 1 else f" each of {workers} workers"
    return f"threads: {cores_given()} cores given; explorer {explorer}, trainer {trainer}{per}; {wait}"
