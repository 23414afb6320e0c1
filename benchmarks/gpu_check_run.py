"""How ``benchmarks/gpu_check.py`` runs its sections so that nothing it measured can be lost.

Why: a GPU machine is lent for one job of a few minutes. One failing contender, one hung CUDA
test or one slow compile must cost that entry alone, and a job killed at its limit must leave
every entry it finished on disk.

- Every section runs in a child process (:func:`supervise`) with a time limit from the plan.
  The child announces its entries, then writes one line per entry to an events file as it
  starts and as it finishes it (flushed and fsynced: a kill loses nothing written).
- The parent reads those lines while the child runs and rewrites the report (JSON and
  markdown, atomically) after every finished entry. An entry past its own limit, or the
  section past its limit, is ended by killing the child's process group: the entry is recorded
  as ``timeout`` and -- while the section has time left -- a new child runs the entries not yet
  recorded. A child that dies inside an entry (a crash, a CUDA error that kills the process)
  records that entry as ``failed`` with the tail of its log, and the rest run the same way.
- Inside a child an entry that raises is recorded with its error and traceback
  (:func:`run_entries`); an entry marked ``own_process`` (a ``torch.compile`` contender) runs in
  a grandchild with its own limit, so its compile threads and caches never touch the others.
- ``GPU_CHECK_FAULT`` (``"section/entry=raise,section/entry=hang,section/entry=exit"``) makes named
  entries raise, hang or kill their process as they start: the tests prove the isolation with it,
  on the CPU, through the code paths a real failure takes.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import re
import signal
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import harness

FAULT_ENV = "GPU_CHECK_FAULT"
POLL_S = 0.2


@dataclass(frozen=True)
class Entry:
    """One measurement of a section: ``run()`` returns its figures; ``limit_s`` bounds it."""

    name: str
    limit_s: float
    run: Callable[[], dict]
    own_process: bool = False  # run in a grandchild of its own (compile contenders)


# -- the child's side --------------------------------------------------------------------------
def faults() -> dict[str, str]:
    spec = os.environ.get(FAULT_ENV, "")
    pairs = [item.split("=", 1) for item in spec.split(",") if item.strip()]
    bad = [p for p in pairs if len(p) != 2 or p[1] not in ("raise", "hang", "exit")]
    if bad:
        raise SystemExit(f"{FAULT_ENV}: expected entry=raise|hang|exit, got {spec!r}")
    return {name.strip(): kind for name, kind in pairs}


def inject_fault(name: str) -> None:
    """The test hook: make entry ``name`` raise, hang or kill its process, as ``GPU_CHECK_FAULT`` says."""
    kind = faults().get(name)
    if kind == "raise":
        raise RuntimeError(f"fault injected into {name} ({FAULT_ENV})")
    if kind == "hang":
        while True:  # a hung kernel or a deadlock: only a kill ends it
            time.sleep(3600)
    if kind == "exit":
        os.kill(os.getpid(), signal.SIGKILL)  # a crash that takes the process with it


class Events:
    """The child's log of what it did, one JSON line per event, each on disk before it goes on."""

    def __init__(self, path: Path) -> None:
        self.file = path.open("a", encoding="utf-8")

    def write(self, **event: Any) -> None:
        self.file.write(json.dumps(event, default=str) + "\n")
        self.file.flush()
        os.fsync(self.file.fileno())


def failure(exc: BaseException) -> dict:
    return {"status": "failed", "error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()[-3000:]}


def run_entries(
    section: str,
    entries: Callable[[], list[Entry]],
    events: Events,
    skip: set[str],
    only: str | None,
    child_argv: list[str],
) -> None:
    """Run ``section``'s entries in this process, each isolated; ``only``: one entry (a grandchild)."""
    try:
        listed = entries()
    except Exception as exc:  # noqa: BLE001 -- the section's setup failed: recorded, the check goes on
        events.write(event="setup_failed", result=failure(exc))
        return
    events.write(event="plan", entries=[[e.name, e.limit_s] for e in listed])
    # The parent ends an entry at its limit; an own-process entry's grandchild is ended by this
    # child first (at the limit), so the parent waits a little longer for that one.
    for entry in listed:
        if entry.name in skip or (only is not None and entry.name != only):
            continue
        events.write(event="start", entry=entry.name, limit_s=entry.limit_s + (15 if entry.own_process else 0))
        t0 = time.monotonic()
        try:
            if entry.own_process and only is None:
                result = in_own_process(entry, child_argv)  # a fault for it fires in there
            else:
                inject_fault(f"{section}/{entry.name}")
                result = entry.run()
        except Exception as exc:  # noqa: BLE001 -- recorded with its traceback; the other entries run
            result = failure(exc)
        result.setdefault("seconds", round(time.monotonic() - t0, 2))
        events.write(event="done", entry=entry.name, result=result)


def in_own_process(entry: Entry, child_argv: list[str]) -> dict:
    """``entry`` in a grandchild (this child's command, ``--entry NAME``), killed at its limit."""
    slug = re.sub(r"[^A-Za-z0-9_.-]+", "_", entry.name)
    events = Path(child_argv[child_argv.index("--events") + 1]).with_suffix(f".{slug}.jsonl")
    argv = [*child_argv, "--entry", entry.name]
    argv[argv.index("--events") + 1] = str(events)
    log = events.with_suffix(".log")
    with log.open("w") as err:
        proc = popen(argv, err)
        try:
            proc.wait(timeout=entry.limit_s)
        except subprocess.TimeoutExpired:
            kill_group(proc)
            return {"status": "timeout", "error": f"killed after {entry.limit_s:.0f} s (its own process's limit)"}
    done = [e for e in read_events(events) if e.get("event") == "done" and e.get("entry") == entry.name]
    if done:
        return done[-1]["result"]
    return {"status": "failed", "error": f"its process exited with {proc.returncode}: {tail(log)}"}


# -- the parent's side -------------------------------------------------------------------------
def _die_with_parent() -> None:
    """In a new child before it runs: SIGKILL when its parent dies (Linux), so a killed check
    leaves no section running on; elsewhere a no-op."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def popen(argv: list[str], log) -> subprocess.Popen:
    """A child in a process group of its own (killed whole at a limit) that dies with its parent."""
    return subprocess.Popen(
        argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, preexec_fn=_die_with_parent
    )


def kill_group(proc: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def read_events(path: Path, start: int = 0) -> list[dict]:
    """Whole lines from line ``start`` on (a line being written is left for the next read)."""
    if not path.is_file():
        return []
    lines = path.read_text(encoding="utf-8").split("\n")[:-1]
    return [json.loads(line) for line in lines[start:] if line]


def tail(log: Path, chars: int = 1500) -> str:
    try:
        return log.read_text(errors="replace")[-chars:]
    except OSError:
        return "(no log)"


@dataclass
class SectionRun:
    """What the parent knows of a running section; ``result`` is the report's entry for it."""

    name: str
    limit_s: float
    result: dict = field(default_factory=dict)

    @property
    def entries(self) -> dict[str, dict]:
        return self.result.setdefault("entries", {})


def supervise(run: SectionRun, child_argv: list[str], logs: Path, on_change: Callable[[], None]) -> None:
    """Run ``run``'s section in children until every entry is recorded or its time is gone."""
    t0 = time.monotonic()
    deadline = t0 + run.limit_s
    plan: list[tuple[str, float]] | None = None
    for attempt in range(64):  # at most one restart per entry ended; the cap only guards a bug
        events_path = logs / f"{run.name}-{attempt}.jsonl"
        log = events_path.with_suffix(".log")
        argv = [*child_argv, "--events", str(events_path), "--skip", *run.entries]
        with log.open("w") as err:
            proc = popen(argv, err)
        seen, current, killed = 0, None, False  # events read; (entry, started, limit) running now
        recorded = len(run.entries)
        while True:
            exited = proc.poll() is not None
            for event in read_events(events_path, seen):
                seen += 1
                kind = event["event"]
                if kind == "plan":
                    plan = [(n, float(s)) for n, s in event["entries"]]
                elif kind == "start":
                    current = (event["entry"], time.monotonic(), float(event["limit_s"]))
                    print(f"gpu_check: {run.name}/{event['entry']} ...", file=sys.stderr, flush=True)
                elif kind == "done":
                    run.entries[event["entry"]] = event["result"]
                    current = None
                    on_change()
                elif kind == "env":
                    run.result["env"] = event["env"]
                elif kind == "setup_failed":
                    run.result.update(event["result"])
            if exited:
                break
            now = time.monotonic()
            over_entry = current is not None and now - current[1] > current[2]
            if over_entry or now > deadline:
                kill_group(proc)
                killed = True
                if current is not None:
                    why = "its own" if over_entry else "the section's"
                    run.entries[current[0]] = {
                        "status": "timeout",
                        "error": f"killed after {now - current[1]:.0f} s ({why} limit: "
                        f"{current[2] if over_entry else run.limit_s:.0f} s)",
                        "seconds": round(now - current[1], 2),
                    }
                    current = None
                on_change()
                break
            time.sleep(POLL_S)
        if current is not None:  # the child died inside an entry
            run.entries[current[0]] = {
                "status": "failed",
                "error": f"the section's process exited with {proc.returncode} inside this entry: {tail(log)}",
            }
            on_change()
        elif plan is None and "error" not in run.result and (proc.returncode or killed):
            why = "was killed at the section's limit" if killed else f"exited with {proc.returncode}"
            run.result.update(
                status="failed", error=f"the section's process {why} before it listed its entries: {tail(log)}"
            )
        left = [n for n, _ in plan or [] if n not in run.entries]
        if not left or plan is None or "error" in run.result:
            break
        if time.monotonic() >= deadline:
            for name in left:
                run.entries[name] = {"status": f"skipped: the section's {run.limit_s:.0f} s were spent"}
            break
        if len(run.entries) == recorded:  # a process that ended without recording anything: no loop
            for name in left:
                run.entries[name] = {"status": "failed", "error": f"never run: {tail(log)}"}
            break
    run.result["seconds"] = round(time.monotonic() - t0, 1)
    bad = [n for n, e in run.entries.items() if e.get("status") in ("failed", "timeout")]
    if bad or run.result.get("status") == "failed":
        run.result["status"] = "failed"
        run.result["failed_entries"] = bad
    on_change()


def git_commit(root: Path) -> str:
    """The checkout's commit; a GPU machine's copy of the tree has no repository (``--commit`` then)."""
    return harness.git_commit(root, missing="unknown (no git here; pass --commit)")


write_atomically = harness.write_atomically  # a reader (or a kill) sees the old file or the new one, never half
