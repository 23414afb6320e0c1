"""Step metrics: timing of phases, and the logger that feeds the monitors (JSONL, TensorBoard, ...) and the progress bar."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from trinity_like.components import build_params
from trinity_like.registry import MONITOR

# The headline figures shown on the progress bar, in this order, when present.
BAR_KEYS = (
    ("reward/mean", "reward"),
    ("eval/accuracy", "eval_acc"),
    ("loss", "loss"),
    ("kl", "kl"),
    ("response_length/mean", "len"),
    ("time/step", "s/step"),
)


class PhaseTimer:
    """Accumulates wall time per phase: ``with timer("rollout"): ...``."""

    def __init__(self) -> None:
        self.times: dict[str, float] = {}

    @contextmanager
    def __call__(self, phase: str) -> Iterator[None]:
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.times[phase] = self.times.get(phase, 0.0) + time.perf_counter() - t0

    def metrics(self) -> dict[str, float]:
        return {f"time/{k}": v for k, v in self.times.items()}


class MetricsLogger:
    """Sends each step's metrics to every configured monitor and updates the progress bar."""

    def __init__(
        self, run_dir: str, backends: Sequence[str], *, total_steps: int, start_step: int, progress: bool, desc: str
    ) -> None:
        self.sinks = []
        for name in backends:
            cls = MONITOR.get(name)
            self.sinks.append(cls(run_dir=run_dir, params=build_params(cls, {}, where=f"monitor.backends.{name}")))
        self.bar = None
        if progress:
            from tqdm.auto import tqdm

            self.bar = tqdm(total=total_steps, initial=start_step, desc=desc, unit="step", dynamic_ncols=True)
        self.last: dict[str, float] = {}

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        for sink in self.sinks:
            sink.log(step, metrics)
        self.last.update({k: v for k, v in metrics.items() if isinstance(v, (int, float))})
        if self.bar is not None:
            shown = {short: f"{self.last[key]:.3g}" for key, short in BAR_KEYS if key in self.last}
            self.bar.set_postfix(shown, refresh=False)

    def advance(self) -> None:
        if self.bar is not None:
            self.bar.update(1)

    def write(self, text: str) -> None:
        """One line for people. Without a bar it goes to stdout in one write of its own: Ray's
        background threads print to the same stream (a dead worker's "(raylet)" report), and
        buffered text from two threads can interleave mid-line."""
        if self.bar is not None:
            self.bar.write(text)
            return
        sys.stdout.flush()
        try:
            fd = sys.stdout.fileno()
        except (AttributeError, OSError, ValueError):  # a stream without a descriptor (captured in memory)
            print(text, flush=True)
            return
        os.write(fd, (text + "\n").encode("utf-8", "replace"))

    def close(self) -> None:
        for sink in self.sinks:
            sink.close()
        if self.bar is not None:
            self.bar.close()
