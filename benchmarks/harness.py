"""The benchmark harness every script in benchmarks/ runs on.

What a figure needs besides its number, in one place:

- **context**: the commit (:func:`git_commit`), the machine (:func:`machine`, :func:`cpu_name`:
  the CPU's model, count and the flags that decide its matmul rate -- ``avx512_bf16``, ``amx_*``
  -- and the GPU when there is one), the command that made it (:func:`command`), the date;
- **rounds and interleaving** (:func:`orders`, :func:`interleaved`): every round runs every
  contender once, the order alternating (or rotating) between rounds, so a drifting load on a
  shared machine falls on every side alike;
- **isolation** (:func:`contender_main` in the child, :func:`isolated` in the parent): a
  contender built and run in its own process (a :class:`Contender`), its peak memory sampled
  from outside (:class:`PeakMemory`), its failure recorded as an ``error`` rather than
  taking the other contenders' results with it;
- **results** (:func:`write_results`, :func:`md_table`): ``OUT.json`` and ``OUT.md``, each
  written whole or not at all, so a run cut off mid-write keeps the previous file;
- **flags and the CLI** (:func:`pick`: a comma list of contenders; :func:`run_cli`: a recipe run).

A script imports what it needs (``from harness import ...``; every script puts its own folder
first on ``sys.path``) and keeps only its workload, its contenders and its table's layout.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import shlex
import subprocess
import sys
import threading
import time
import traceback
import uuid
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, Protocol, TypeVar

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
# CPU flags that decide a matmul's rate (reported beside every figure when the CPU has them).
NOTABLE_CPU_FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "avx512_fp16", "amx_tile", "amx_bf16", "amx_int8")
T = TypeVar("T")
R = TypeVar("R")


# == context: commit, machine, command ======================================================
def log(text: str) -> None:
    """A timestamped progress line on stderr (results go to files; stdout carries the table)."""
    print(f"[{time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


def git_commit(root: Path = ROOT, missing: str = "unknown") -> str:
    """The short commit of the checkout, ``+dirty`` when tracked files differ from it; ``missing``
    where there is no repository or no git program (a GPU machine's copy of the tree)."""
    argv = ["git", "describe", "--always", "--dirty=+dirty", "--abbrev=7"]
    try:
        out = subprocess.run(argv, cwd=root, capture_output=True, text=True, check=False)
    except OSError:
        return missing
    return out.stdout.strip() or missing


def _cpuinfo(key: str) -> str | None:
    info = Path("/proc/cpuinfo")
    with contextlib.suppress(OSError):
        for line in info.read_text(errors="replace").splitlines():
            if line.startswith(key):
                return line.split(":", 1)[1].strip()
    return None


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo``; the platform's word for it elsewhere)."""
    return _cpuinfo("model name") or platform.processor() or platform.machine()


def gpu_name() -> str | None:
    """The first GPU's name, None without one (or without torch)."""
    try:
        import torch
    except ImportError:
        return None
    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else None


def cpu_name() -> str:
    """The CPU beside every figure: model name, CPU count, and its bf16 units (as the precision
    choice sees them: ``TRINITY_LIKE_CPU_BF16`` overrides the probe)."""
    from trinity_like.models.device import cpu_bf16_flags

    units = ", ".join(sorted(cpu_bf16_flags())) or "no bf16 units"
    return f"{cpu_model()}, {os.cpu_count()} CPUs, {units}"


def machine() -> dict[str, Any]:
    """The machine as data: CPU model, count, notable flags (:data:`NOTABLE_CPU_FLAGS`), GPU, Python, torch."""
    return {
        "cpu": cpu_model(),
        "cpus": os.cpu_count(),
        "cpu_flags": [f for f in NOTABLE_CPU_FLAGS if f in (_cpuinfo("flags") or "").split()],
        "gpu": gpu_name(),
        "python": platform.python_version(),
        "torch": getattr(sys.modules.get("torch"), "__version__", None),  # gpu_name() imported it
    }


def command(script: str, argv: Sequence[str] | None = None) -> str:
    """The command line that reproduces this run: ``python benchmarks/<script> <args>`` (``argv``:
    the arguments main() was given, ``sys.argv[1:]`` when None)."""
    return shlex.join(["python", f"benchmarks/{script}", *(sys.argv[1:] if argv is None else argv)])


def utc_now() -> str:
    return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())


def run_cli(args: Sequence[str], log: Path) -> float:
    """``trinity-like ARGS`` from the repository root, its output in ``log``; its wall time. A
    failure exits naming the command, its status and the log, with the log's last lines."""
    log = Path(log)
    log.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    with log.open("w") as out:
        cmd = [sys.executable, "-m", "trinity_like.cli", *args]
        code = subprocess.run(cmd, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, check=False).returncode
    if code != 0:
        raise SystemExit(f"trinity-like {shlex.join(args)}: exit {code}; see {log}:\n{log.read_text()[-1500:]}")
    return time.perf_counter() - t0


# == timing =================================================================================
def timer(fn: Callable[[], Any]) -> float:
    """The wall seconds of ``fn()``."""
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def timed(fn: Callable, sink: dict[str, float], key: str) -> Callable:
    """``fn`` that adds its wall time to ``sink[key]`` (a phase inside a step someone else runs)."""

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            sink[key] = sink.get(key, 0.0) + time.perf_counter() - t0

    return wrapper


def matmul_peak_gflops(size: int = 1024, reps: int = 5, dtype: Any = None) -> float:
    """The machine's matmul rate in ``dtype`` (default fp32) now, best of ``reps``: the ceiling for dense model work."""
    import torch

    dtype = dtype or torch.float32
    a, b = torch.randn(size, size, dtype=dtype), torch.randn(size, size, dtype=dtype)
    return 2 * size**3 / min(timer(lambda: a @ b) for _ in range(reps)) / 1e9


# == rounds and interleaving ================================================================
def pick(flag: str, text: str, known: Iterable[str]) -> list[str]:
    """The names of a comma list given to ``flag``, each one of ``known``; else exit naming the flag."""
    names, known = [n.strip() for n in text.split(",") if n.strip()], list(known)
    if not names or (unknown := [n for n in names if n not in known]):
        raise SystemExit(f"{flag}: unknown {unknown if names else 'empty list'}; choose from {', '.join(known)}")
    return names


def orders(names: Sequence[T], rounds: int, *, rotate: bool = False) -> list[list[T]]:
    """The running order of each round: ``names`` forward in even rounds and reversed in odd
    ones (so each side goes first and last equally), or with ``rotate`` shifted by one each
    round (so each side goes first in turn)."""
    names = list(names)
    if rotate:
        return [names[r % len(names) :] + names[: r % len(names)] for r in range(rounds)]
    return [names if r % 2 == 0 else names[::-1] for r in range(rounds)]


def interleaved(
    run: Callable[[T, int], R],
    names: Sequence[T],
    rounds: int,
    *,
    rotate: bool = False,
    after_round: Callable[[int, dict[T, list[R]]], None] | None = None,
) -> dict[T, list[R]]:
    """``run(name, round)`` for every name in every round, in :func:`orders`; each name's
    results in round order. ``after_round(round, results)`` after each round (write what
    there is: a run cut off keeps its finished rounds)."""
    out: dict[T, list[R]] = {n: [] for n in names}
    for r, order in enumerate(orders(names, rounds, rotate=rotate)):
        for name in order:
            out[name].append(run(name, r))
        if after_round is not None:
            after_round(r, out)
    return out


# == peak memory of a process group =======================================================
class PeakMemory:
    """Peak memory of one process and everything it starts, sampled in a thread.

    Members: the process's descendants, plus every process whose environment carries this
    sampler's tag (``env`` holds it: give it to the process started). Ray's workers are
    children of the raylet, not of the driver, and Ray may reparent them; they inherit the
    raylet's environment, which is the driver's, so the tag finds them wherever they hang.
    New ``ray::`` processes that carry no tag are counted apart (``untagged_ray``): another
    user's Ray on a shared machine, or a worker this sampler missed.

    Reported: the peak over samples of the summed RSS (shared pages, libraries and Ray's
    object store, counted once per process that maps them) and of the summed PSS (each
    shared page split between the processes that map it: what the group costs the machine).

    The sampler must not slow what it measures. RSS is a counter the kernel keeps
    (``/proc/PID/statm``): read every ``interval_s``. PSS is not: the kernel walks every page
    table of the process to sum it (``smaps_rollup``), ~50 ms for a 4.5 GB verl worker, holding
    the process's memory-map lock meanwhile; read every 0.25 s it made a verl GRPO step 25 %
    slower (16.5 s against 13.3 s in one run), and the larger the contender's memory, the more
    it lost. So PSS is read only every ``pss_interval_s``.
    """

    VAR = "BENCH_PEAK_MEMORY_TAG"

    def __init__(self, interval_s: float = 0.25, pss_interval_s: float = 2.0) -> None:
        import psutil

        self._psutil = psutil
        self.tag = uuid.uuid4().hex
        self.env = {**os.environ, self.VAR: self.tag}
        self.interval_s = interval_s
        self.pss_every = max(1, round(pss_interval_s / interval_s))  # samples between PSS reads
        self.peak_rss = self.peak_pss = 0
        self.peak_pss_by_process: dict[str, int] = {}  # kind of process -> its PSS in the peak sample
        self.max_processes = 0
        self.untagged_ray: set[int] = set()
        self._seen: dict[tuple[int, float], bool] = {}  # (pid, start time) -> member
        self._before = {p.pid for p in psutil.process_iter() if self._is_ray(p)}
        self._root: int | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self, pid: int) -> None:
        self._root = pid
        self._thread.start()

    def stop(self) -> dict[str, float]:
        self._stop.set()
        self._thread.join()
        by_process = sorted(self.peak_pss_by_process.items(), key=lambda kv: -kv[1])
        return {
            "peak_rss_gb": self.peak_rss / 1e9,
            "peak_pss_gb": self.peak_pss / 1e9,
            "peak_pss_gb_by_process": {k: round(v / 1e9, 3) for k, v in by_process},
            "rss_interval_s": self.interval_s,
            "pss_interval_s": self.interval_s * self.pss_every,
            "max_processes": self.max_processes,
            "untagged_new_ray_processes": len(self.untagged_ray),
        }

    def members(self) -> list:
        """The processes of the group now (the root, its descendants, tagged processes)."""
        psutil = self._psutil
        found = {}
        with contextlib.suppress(psutil.Error):
            root = psutil.Process(self._root)
            found = {p.pid: p for p in (root, *root.children(recursive=True))}
        for proc in psutil.process_iter():
            if proc.pid in found:
                continue
            try:
                key = (proc.pid, proc.create_time())
                if key not in self._seen:
                    self._seen[key] = proc.environ().get(self.VAR) == self.tag
                    if not self._seen[key] and proc.pid not in self._before and self._is_ray(proc):
                        self.untagged_ray.add(proc.pid)
            except psutil.Error:
                continue
            if self._seen[key]:
                found[proc.pid] = proc
        return list(found.values())

    def _run(self) -> None:
        psutil = self._psutil
        sample = 0
        while not self._stop.is_set():
            rss = pss = 0
            with_pss = sample % self.pss_every == 0
            sample += 1
            procs = self.members()
            shares: dict[str, int] = {}
            for proc in procs:
                try:
                    if with_pss:
                        mem = proc.memory_full_info()
                        pss += mem.pss
                        name = self._name(proc)
                        shares[name] = shares.get(name, 0) + mem.pss
                    else:
                        mem = proc.memory_info()
                except psutil.Error:
                    continue
                rss += mem.rss
            if pss > self.peak_pss:
                self.peak_pss_by_process = shares
            self.peak_rss, self.peak_pss = max(self.peak_rss, rss), max(self.peak_pss, pss)
            self.max_processes = max(self.max_processes, len(procs))
            self._stop.wait(self.interval_s)

    def _name(self, proc) -> str:
        """A process's kind: a Ray actor's class (``ray::TrinityVerlWorker.method`` -> the
        class), ``ray::IDLE``, Ray's own daemons by their program, else ``driver``."""
        try:
            cmd = proc.cmdline()
        except self._psutil.Error:
            return "?"
        if proc.pid == self._root:
            return "driver"
        if cmd and cmd[0].startswith("ray::"):
            return cmd[0].split(".")[0].split(":")[-1] or cmd[0]
        program = next((Path(c).name for c in cmd if "/ray/" in c), "")
        return f"ray {program.removesuffix('.py')}" if program else Path(cmd[0]).name if cmd else "?"

    def _is_ray(self, proc) -> bool:
        with contextlib.suppress(self._psutil.Error):  # vanished, or not ours to read
            return (proc.cmdline() or [""])[0].startswith("ray::")
        return False


def stop_group(memory: PeakMemory, proc: subprocess.Popen) -> int:
    """Wait for the contender's processes to go (Ray's shut down a moment after the driver);
    stop any still there after 30 s -- every one was started by the command measured. Returns how many were stopped."""
    import psutil

    if proc.poll() is None:
        proc.kill()
        proc.wait()
    deadline = time.monotonic() + 30
    while (left := memory.members()) and time.monotonic() < deadline:
        time.sleep(0.5)
    for p in left:
        with contextlib.suppress(psutil.NoSuchProcess):
            p.kill()
    psutil.wait_procs(left, timeout=10)
    return len(left)


# == contenders in their own processes ======================================================
class Contender(Protocol):
    """One side of a benchmark, built in its own process (its constructor is the setup timed).

    Example (a child process runs ``contender_main(lambda: Sleeper(), 2, out)``)::

        class Sleeper:
            def steps(self, count):  # the first record is the warm-up
                return [{"time/step": time.sleep(0.01) or 0.01} for _ in range(count)]
            def info(self): return {"kind": "sleep"}
            def close(self): pass
    """

    def steps(self, count: int) -> list[dict[str, Any]]:
        """Run ``count`` steps (the first a warm-up); one record per step."""
        ...

    def info(self) -> dict[str, Any]:
        """What describes this contender in the results (its settings, its library's version)."""
        ...

    def close(self) -> None: ...


def contender_main(build: Callable[[], Contender], steps: int, out: Path, name: str = "") -> dict[str, Any]:
    """In the child: build the contender, run ``steps`` steps (the first a warm-up), close it,
    and write ``{"name", "setup_s", "warmup", "steps", **info}`` to ``out`` (and return it). A failure writes
    ``{"name", "error"}`` (its last line) before it propagates: the parent reports it."""
    try:
        t0 = time.perf_counter()
        contender = build()
        setup_s = time.perf_counter() - t0
        log(f"{name}: built in {setup_s:.1f} s")
        try:
            records = contender.steps(steps)
            info = contender.info()
        finally:
            contender.close()
    except BaseException as exc:
        lines = traceback.format_exception_only(type(exc), exc)
        Path(out).write_text(json.dumps({"name": name, "error": lines[-1].strip()}))
        raise
    result = {"name": name, "setup_s": setup_s, "warmup": records[0], "steps": records[1:], **info}
    Path(out).write_text(json.dumps(result, indent=1, default=float))
    return result


def isolated(argv: Sequence[str], out: Path | None = None, *, timeout: float | None = None, cwd: Path = ROOT) -> dict:
    """Run ``argv`` in its own process (a contender writes its JSON to ``out``), sampling the peak
    memory of it and all it starts; its JSON plus ``memory``, ``wall_s`` and ``leftover_processes``.

    A contender that fails (non-zero exit, timeout) yields ``{"error": ..., ...}``: the child's
    own error line when it wrote one, else its exit status."""
    sampler = PeakMemory()
    t0 = time.perf_counter()
    proc = subprocess.Popen(list(argv), env=sampler.env, cwd=cwd)
    sampler.start(proc.pid)
    try:
        rc: int | None = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        log(f"{Path(argv[1]).name if len(argv) > 1 else argv[0]}: still running after {timeout} s; stopping it")
        rc = None
    wall = time.perf_counter() - t0
    peak = sampler.stop()
    leftover = stop_group(sampler, proc)
    try:
        result = json.loads(Path(out).read_text()) if out else {}
    except (OSError, ValueError):
        result = {}
    if rc != 0 or "error" in result:
        why = "timed out" if rc is None else f"exit status {rc}"
        result["error"] = f"{result['error']} ({why})" if "error" in result else why
    result.update(memory=peak, wall_s=wall, leftover_processes=leftover)
    return result


# == results ================================================================================
def write_atomically(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` so that a reader (or a kill) sees the old file or the new one, never half."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with tmp.open("w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def write_results(out: Path | str, data: Any, text: str | Sequence[str] = "", *, indent: int = 1) -> str:
    """``OUT.json`` (``data``) and, when ``text`` (or its lines) is given, ``OUT.md`` ending in one
    newline; returns that text. ``OUT`` may end in ``.json`` or ``.md``."""
    stem = str(out).removesuffix(".json").removesuffix(".md")
    write_atomically(Path(stem + ".json"), json.dumps(data, indent=indent, default=float) + "\n")
    text = (text if isinstance(text, str) else "\n".join(text)).rstrip("\n") + "\n"
    if text.strip():
        write_atomically(Path(stem + ".md"), text)
    return text


def md_table(header: Sequence[str], rows: Iterable[Sequence[Any]]) -> list[str]:
    """A markdown table's lines: ``| a | b |``, ``|---|---|``, then one line per row."""
    lines = ["| " + " | ".join(header) + " |", "|---" * len(header) + "|"]
    return lines + ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
