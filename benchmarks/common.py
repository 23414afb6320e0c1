"""Helpers the benchmarks share: the machine's matmul peak, the commit, a process group's memory."""

from __future__ import annotations

import contextlib
import os
import subprocess
import threading
import time
import uuid
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent


def matmul_peak_gflops(size: int = 1024, reps: int = 5, dtype: torch.dtype = torch.float32) -> float:
    """The machine's matmul rate in ``dtype`` now (best of ``reps``), the ceiling for dense model work."""
    a, b = torch.randn(size, size, dtype=dtype), torch.randn(size, size, dtype=dtype)
    best = float("inf")
    for _ in range(reps):
        start = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - start)
    return 2 * size**3 / best / 1e9


def git_commit() -> str:
    """The short commit of the checkout, ``+dirty`` when tracked files differ from it."""
    out = subprocess.run(
        ["git", "describe", "--always", "--dirty=+dirty", "--abbrev=7"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    return out.stdout.strip() or "unknown"


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
        return {
            "peak_rss_gb": self.peak_rss / 1e9,
            "peak_pss_gb": self.peak_pss / 1e9,
            "peak_pss_gb_by_process": {
                k: round(v / 1e9, 3) for k, v in sorted(self.peak_pss_by_process.items(), key=lambda kv: -kv[1])
            },
            "rss_interval_s": self.interval_s,
            "pss_interval_s": self.interval_s * self.pss_every,
            "max_processes": self.max_processes,
            "untagged_new_ray_processes": len(self.untagged_ray),
        }

    def members(self) -> list:
        """The processes of the group now (the root, its descendants, tagged processes)."""
        psutil = self._psutil
        found = {}
        try:
            root = psutil.Process(self._root)
            found[root.pid] = root
            found.update((p.pid, p) for p in root.children(recursive=True))
        except psutil.Error:
            pass
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
        try:
            cmd = proc.cmdline()
        except self._psutil.Error:  # vanished, or not ours to read
            return False
        return bool(cmd) and cmd[0].startswith("ray::")


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


def cpu_name() -> str:
    """The CPU beside every figure: model name (``/proc/cpuinfo``), CPU count, and its bf16 units."""
    import platform

    from trinity_like.models.device import cpu_bf16_flags

    name = platform.processor() or platform.machine()
    info = Path("/proc/cpuinfo")
    if info.is_file():
        lines = info.read_text(errors="replace").splitlines()
        name = next((ln.split(":", 1)[1].strip() for ln in lines if ln.startswith("model name")), name)
    units = ", ".join(sorted(cpu_bf16_flags())) or "no bf16 units"
    return f"{name}, {os.cpu_count()} CPUs, {units}"
