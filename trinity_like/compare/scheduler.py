"""Run a comparison's runs as subprocesses, as many at once as cores and memory allow; resume and reuse.

**How many at once.** ``jobs`` runs at a time, each with ``threads`` torch threads, so that
``jobs x threads <= cores``: by default one run per core while the memory estimate allows
(``--jobs`` and ``--threads`` fix them). A run's memory is estimated from its model's size
(:func:`estimate_gb`), and a run starts only while the machine's available memory holds its
estimate (the first run always starts). Threads reach a run through ``OMP_NUM_THREADS`` (the
local engine and an in-process explorer take torch's default from it) and, for a train engine
whose workers set their own (``TrainEngineTraits.own_threads``: ``verl``),
``cluster.explorer_threads`` / ``cluster.trainer_threads`` on its command line.

**Resume and reuse.** Each run keeps a state file beside its folder
(``<out>/runs/<label>/seed_<s>.json``: its identity hash, command, attempts). A run whose
state says it finished, with the same hash, and whose metrics show its last step, is
reused without starting anything. A run with the same hash that did not finish is started
again with the same command: ``trinity-like run`` resumes from its latest checkpoint. A run
whose identity changed (the recipe or ``--set`` was edited) is moved aside, folder and
state, to ``<out>/stale/`` and run afresh: its checkpoints belong to another plan.

Each attempt writes its output to ``<out>/logs/<label>_seed<s>.log``; a failed run is
reported with the last line of that log, and the other runs go on. Ctrl-C or ``kill``
(SIGTERM) stops the running runs and records them as stopped; the next call resumes them.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from trinity_like.atomic import write_atomic
from trinity_like.compare.entries import Run
from trinity_like.errors import TrinityError
from trinity_like.monitor.sinks import read_jsonl_metrics

if TYPE_CHECKING:
    from trinity_like.trainer.engines import TrainEngineTraits

GB = 1024**3
BASE_GB = 1.0  # Python, torch, transformers and the run's buffers, before any model
WEIGHT_COPIES = (
    7  # fp32 policy: weights, gradients, two AdamW moments, the explorer's copy, ~2 of activations and cache
)
POLL_S = 0.05  # how often running processes are checked: what a run's end waits for before the next starts


def model_params(model: str) -> int:
    """Parameter count of a model folder or built-in id, from its safetensors headers (no weights loaded)."""
    from safetensors import safe_open

    from trinity_like.models.resolve import resolve_model_path

    folder = resolve_model_path(model)
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise TrinityError(f"{folder}: no *.safetensors to size the model from; give --memory-gb")
    total = 0
    for path in files:
        with safe_open(str(path), framework="pt") as fh:
            for name in fh.keys():  # noqa: SIM118 -- safe_open is not a mapping
                shape = fh.get_slice(name).get_shape()
                n = 1
                for d in shape:
                    n *= d
                total += n
    return total


def estimate_gb(run: Run, default_model: str) -> float:
    """Peak resident memory of one run, estimated from its model size (fp32): about 4.5 GB for
    SmolLM2-135M on the local engine (measured peak about 4.9 GB, docs/machines.md), 1 GB
    for the tiny model; plus what its train engine declares beside (``extra_memory_gb``: verl's
    Ray head and worker processes)."""
    weights_gb = model_params(run.model or default_model) * 4 / GB
    return BASE_GB + weights_gb * (WEIGHT_COPIES + run.extra_models) + _traits(run).extra_memory_gb


def _traits(run: Run) -> TrainEngineTraits:
    """What ``run``'s train engine declares (:mod:`trinity_like.trainer.engines`; imported here: it loads torch)."""
    from trinity_like.trainer.engines import train_engine_traits

    return train_engine_traits(run.engine)


def available_gb() -> float:
    import psutil

    return psutil.virtual_memory().available / GB


def cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


@dataclass(frozen=True)
class Sizing:
    jobs: int
    threads: int
    estimate_gb: float  # the largest run's
    available_gb: float
    cores: int

    def describe(self) -> str:
        return (
            f"{self.jobs} run(s) at a time x {self.threads} torch thread(s), on {self.cores} core(s); "
            f"about {self.estimate_gb:.1f} GB per run of {self.available_gb:.1f} GB available"
        )


def size_jobs(estimates: list[float], pending: int, jobs: int | None, threads: int | None) -> Sizing:
    """``jobs`` (runs at once) and ``threads`` (each run's) so that ``jobs x threads <= cores`` and
    ``jobs`` estimates fit in available memory; ``jobs`` / ``threads`` given fix them."""
    n_cores, avail = cores(), available_gb()
    worst = max(estimates, default=BASE_GB)
    if jobs is None:
        by_cores = n_cores // threads if threads else n_cores
        jobs = max(1, min(pending or 1, by_cores, int(avail // worst)))
    if threads is None:
        threads = max(1, n_cores // jobs)
    return Sizing(jobs, threads, worst, avail, n_cores)


# -- state ---------------------------------------------------------------------------------------
def state_path(run: Run) -> Path:
    return run.folder.with_suffix(".json")


def log_path(run: Run, out: Path) -> Path:
    return out / "logs" / f"{run.label}_seed{run.seed}.log"


def read_state(run: Run) -> dict | None:
    path = state_path(run)
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None  # a torn write: treated as no state (the run's folder is then moved aside)


def write_state(run: Run, state: dict) -> None:
    path = state_path(run)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, json.dumps(state, indent=1))


def finished(run: Run) -> bool:
    """The run's last stage logged its last step (a script: its metrics file exists and is not empty)."""
    path = run.run_dirs[-1] / "metrics.jsonl"
    if not path.is_file():
        return False
    rows = read_jsonl_metrics(path)
    if run.total_steps is None:
        return bool(rows)
    return any(r.get("step") == run.total_steps and "time/step" in r for r in rows)


def last_line(path: Path) -> str:
    """The last non-empty line of a log (progress-bar carriage returns split lines too)."""
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            fh.seek(max(0, fh.tell() - 16384))
            tail = fh.read().decode("utf-8", "replace")
    except OSError:
        return "(no log)"
    lines = [ln.strip() for ln in tail.replace("\r", "\n").splitlines() if ln.strip()]
    return lines[-1] if lines else "(empty log)"


def triage(run: Run, out: Path) -> str:
    """``"reuse"`` (finished, same identity), ``"resume"`` (same identity, unfinished) or ``"fresh"``;
    a run whose identity changed is moved to ``<out>/stale/`` first."""
    state = read_state(run)
    if state is not None and run.same_plan(state.get("hash")):
        return "reuse" if state.get("status") == "done" and finished(run) else "resume"
    leftovers = [p for p in (run.folder, state_path(run)) if p.exists()]
    if leftovers:
        stale = out / "stale" / run.label / f"seed_{run.seed}-{time.strftime('%Y%m%d-%H%M%S')}"
        stale.mkdir(parents=True, exist_ok=True)
        for p in leftovers:
            shutil.move(str(p), str(stale / p.name))
        print(f"{run.key}: its plan changed since it ran; the old run moved to {stale}", flush=True)
    return "fresh"


# -- running -------------------------------------------------------------------------------------
@dataclass
class Outcome:
    """What became of a run: ``status`` is ``reused``, ``done``, ``failed`` or ``invalid``."""

    status: str
    message: str = ""
    wall_s: float = 0.0  # this comparison's attempts plus earlier ones (resumed or reused runs)
    attempts: int = 0


def _env(run: Run, threads: int, out: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.update({"OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)})
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.setdefault("RAY_AUTH_MODE", "disabled")
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    # what the tracker sinks name and group the run by (trinity_like/monitor/wandb_sink.py, mlflow_sink.py)
    env["TRINITY_LIKE_RUN_NAME"], env["TRINITY_LIKE_RUN_GROUP"] = run.key, run.label
    env.setdefault("MLFLOW_TRACKING_URI", (out / "mlruns").as_uri())
    return env


def _argv(run: Run, threads: int) -> list[str]:
    if _traits(run).own_threads:  # its workers set their own threads: tell them (kept out of the run's identity)
        return [*run.argv, f"cluster.explorer_threads={threads}", f"cluster.trainer_threads={threads}"]
    return run.argv


def execute(
    runs: list[Run], out: Path, sizing: Sizing, estimates: dict[str, float], start: bool = True
) -> dict[str, Outcome]:
    """Start every pending run, at most ``sizing.jobs`` at once, each while memory allows; returns each
    run's outcome by ``run.key``. Ctrl-C stops the running ones (they resume next time) and re-raises.
    ``start=False`` starts nothing and moves nothing: finished runs are reused, the others are ``not run``."""
    outcomes: dict[str, Outcome] = {}
    pending: list[Run] = []
    for run in runs:
        if run.error:
            outcomes[run.key] = Outcome("invalid", run.error)
            continue
        state = read_state(run) or {}
        if not start:
            same = run.same_plan(state.get("hash")) and state.get("status") == "done" and finished(run)
            wall, attempts = state.get("wall_s", 0.0), len(state.get("attempts", []))
            status = "reused" if same else "not run"
            why = "" if same else f"--no-run: {_so_far(run, out, state)}"
            outcomes[run.key] = Outcome(status, why, wall, attempts)
            continue
        kind = triage(run, out)
        if kind == "reuse":
            outcomes[run.key] = Outcome("reused", "", state.get("wall_s", 0.0), len(state.get("attempts", [])))
            print(f"{run.key}: finished before with the same plan: reused", flush=True)
        else:
            pending.append(run)
    running: dict[str, tuple[Run, subprocess.Popen, float, object]] = {}
    total = len(pending)
    if threading.current_thread() is threading.main_thread():  # `kill` stops the runs as Ctrl-C does
        signal.signal(signal.SIGTERM, _interrupt)
    try:
        while pending or running:
            while pending and len(running) < sizing.jobs:
                run = pending[0]
                if running and available_gb() < estimates[run.key]:
                    break  # wait for memory: a running run ends first
                pending.pop(0)
                running[run.key] = _start(run, out, sizing.threads)
            time.sleep(POLL_S)
            for key, (run, proc, t0, fh) in list(running.items()):
                code = proc.poll()
                if code is None:
                    continue
                fh.close()
                del running[key]
                outcomes[key] = _record(run, out, code, time.perf_counter() - t0)
                done = total - len(pending) - len(running)
                took = outcomes[key].wall_s / 60
                print(
                    f"[{done}/{total}] {key}: {outcomes[key].status} ({took:.1f} min) {outcomes[key].message}",
                    flush=True,
                )
    except BaseException:
        for _run, proc, _, _fh in running.values():
            proc.terminate()
        for run, proc, t0, fh in running.values():
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            fh.close()
            _record(run, out, proc.returncode, time.perf_counter() - t0)
        raise
    return outcomes


def _so_far(run: Run, out: Path, state: dict) -> str:
    """Where an unfinished run stands, from its state file and log."""
    if state.get("hash") is not None and not run.same_plan(state.get("hash")):
        return "its plan changed since it ran (a run without --no-run redoes it)"
    return {
        None: "never started",
        "running": "started, not finished (its compare is still running it, or was stopped)",
        "failed": f"failed: {last_line(log_path(run, out))}",
        "done": "done, but its metrics lack the last step",
    }.get(state.get("status"), str(state.get("status")))


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def _start(run: Run, out: Path, threads: int) -> tuple[Run, subprocess.Popen, float, object]:
    log = log_path(run, out)
    log.parent.mkdir(parents=True, exist_ok=True)
    run.folder.parent.mkdir(parents=True, exist_ok=True)
    state = read_state(run) or {"hash": run.hash, "key": run.key, "attempts": [], "wall_s": 0.0}
    state.update(status="running", command=run.command, log=str(log), hash=run.hash)
    write_state(run, state)
    fh = open(log, "ab")  # noqa: SIM115 -- closed when the process ends (execute)
    fh.write(f"\n$ {run.command}\n".encode())
    fh.flush()
    print(f"{run.key}: started ({threads} thread(s)); log {log}", flush=True)
    proc = subprocess.Popen(_argv(run, threads), stdout=fh, stderr=subprocess.STDOUT, env=_env(run, threads, out))
    return run, proc, time.perf_counter(), fh


def _record(run: Run, out: Path, code: int, wall: float) -> Outcome:
    state = read_state(run) or {"hash": run.hash, "key": run.key, "attempts": [], "wall_s": 0.0}
    state["attempts"].append({"exit": code, "wall_s": wall, "ended": time.strftime("%Y-%m-%d %H:%M:%S")})
    state["wall_s"] = state.get("wall_s", 0.0) + wall
    ok = code == 0 and finished(run)
    state["status"] = "done" if ok else "failed"
    write_state(run, state)
    if ok:
        return Outcome("done", "", state["wall_s"], len(state["attempts"]))
    why = last_line(log_path(run, out)) if code != 0 else "exited 0 but its metrics lack the last step"
    return Outcome("failed", f"exit {code}: {why}", state["wall_s"], len(state["attempts"]))
