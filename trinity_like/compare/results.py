"""What each run reached, read back from its ``metrics.jsonl``: held-out accuracy, its learning signal, curves, compute.

A run's file may hold more than one attempt (a killed run resumed from a checkpoint logs
the steps after it again): :func:`step_rows` keeps each step as its latest attempt wrote it.

**Signals** are those of ``benchmarks/signals.py``, chosen by the metrics a run logs (never
by an algorithm's name), the first that applies:

========================================  ======================  ======================
signal                                    metric                  better
========================================  ======================  ======================
train reward, mean of first k -> last k   the reward key          higher
held-out loss (NLL per assistant token)   ``eval/nll``            lower
held-out reward margin                    ``eval/reward_margin``  higher
held-out pairwise accuracy (reward model) the accuracy key        higher
========================================  ======================  ======================

k is 3, or half the steps when a run has fewer than 6. *Held-out accuracy* is the accuracy
key's value at the run's last step (greedy answers to held-out tasks; a reward model's
pairwise accuracy), its start the first stage's first evaluation.

**Compute** beside steps: rows and tokens the trainer ran (``perf/train_rows``,
``perf/train_tokens`` summed over steps and stages; a script names its own keys), the
seconds its steps took (``time/step`` summed), and the process's wall time (the runner's).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from trinity_like.monitor.sinks import read_jsonl_metrics

K = 3


@dataclass(frozen=True)
class Keys:
    """Metric keys a comparison reads (``--accuracy-key``, ``--reward-key``, ``--rows-key``, ``--tokens-key``, ``--metric``)."""

    accuracy: str = "eval/accuracy"
    reward: str = "reward/mean"
    rows: str = "perf/train_rows"
    tokens: str = "perf/train_tokens"
    extra: tuple[str, ...] = ()  # more metrics compared at their last value


@dataclass(frozen=True)
class Signal:
    name: str
    key: str
    higher_is_better: bool
    first_last_k: bool = False  # mean of the first k steps -> the last k (train reward); else first -> last value


def signal_table(keys: Keys) -> tuple[Signal, ...]:
    return (
        Signal(f"train reward ({keys.reward}), mean of first {K} steps -> last {K}", keys.reward, True, True),
        Signal("held-out loss (eval/nll, NLL per assistant token)", "eval/nll", False),
        Signal("held-out reward margin (eval/reward_margin)", "eval/reward_margin", True),
        Signal(f"held-out pairwise accuracy ({keys.accuracy})", keys.accuracy, True),
    )


def step_rows(rows: list[dict]) -> list[dict]:
    """One merged row per step, in step order, each step as its latest attempt logged it.

    A step's lines (its metrics, then its checkpoint's time, then an evaluation) merge into one
    row. A step's main line (``time/step``) at or below a step already seen starts a redo from a
    checkpoint: the steps from it on are dropped before it merges; a step-0 line after later
    steps is a run started over.

    >>> step_rows([{"step": 0, "a": 1}, {"step": 1, "time/step": 1, "r": 0.1}, {"step": 2, "time/step": 1, "r": 0.9},
    ...            {"step": 2, "time/step": 1, "r": 0.2}, {"step": 2, "c": 5}])
    [{'step': 0, 'a': 1}, {'step': 1, 'time/step': 1, 'r': 0.1}, {'step': 2, 'time/step': 1, 'r': 0.2, 'c': 5}]
    """
    merged: dict[int, dict] = {}
    for r in rows:
        step = r.get("step")
        if not isinstance(step, int):
            continue
        latest = max(merged, default=-1)
        if merged and (("time/step" in r and step <= latest) or (step == 0 and latest > 0)):
            merged = {s: m for s, m in merged.items() if s < step}
        merged.setdefault(step, {"step": step}).update({k: v for k, v in r.items() if k not in ("step", "time")})
    return [merged[s] for s in sorted(merged)]


def _number(v: object) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def series(rows: list[dict], key: str) -> list[tuple[int, float]]:
    """``(step, value)`` of every merged step that has ``key``."""
    return [(r["step"], float(r[key])) for r in rows if _number(r.get(key))]


@dataclass
class RunResult:
    """What one finished run reached (None where its metrics lack the key)."""

    accuracy_start: float | None = None
    accuracy: float | None = None  # at the last step
    accuracy_kind: str = "held-out answer accuracy"
    signal: str | None = None
    signal_higher_is_better: bool = True
    signal_start: float | None = None
    signal_end: float | None = None
    extra: dict[str, float] = field(default_factory=dict)
    steps: int = 0
    rows: float | None = None
    tokens: float | None = None
    step_s: float | None = None
    wall_s: float = 0.0
    accuracy_curve: list[tuple[int, float]] = field(default_factory=list)
    reward_curve: list[tuple[int, float]] = field(default_factory=list)


def _total(stages: list[list[dict]], key: str) -> float | None:
    values = [float(r[key]) for rows in stages for r in rows if _number(r.get(key))]
    return math.fsum(values) if values else None


def read_run(run_dirs: list[Path], keys: Keys, wall_s: float = 0.0) -> RunResult:
    """A run's result from the ``metrics.jsonl`` of each of its stages (the last stage's is read for
    signals and curves; compute sums over stages)."""
    stages = [step_rows(read_jsonl_metrics(d / "metrics.jsonl")) for d in run_dirs if (d / "metrics.jsonl").is_file()]
    out = RunResult(wall_s=wall_s)
    if not stages:
        return out
    rows = stages[-1]
    trained = [r for r in rows if "time/step" in r] or [r for r in rows if _number(r.get(keys.reward))]
    out.steps = len(trained)
    acc = series(rows, keys.accuracy)
    first_acc = series(stages[0], keys.accuracy)
    if acc:
        out.accuracy, out.accuracy_start = acc[-1][1], (first_acc or acc)[0][1]
        out.accuracy_curve = acc
        answered = any("eval/tasks" in r for r in rows if keys.accuracy in r)
        out.accuracy_kind = "held-out answer accuracy" if answered else "held-out accuracy"
    out.reward_curve = [(r["step"], float(r[keys.reward])) for r in trained if _number(r.get(keys.reward))]
    for sig in signal_table(keys):
        if sig.key == keys.accuracy and (not acc or out.accuracy_kind == "held-out answer accuracy"):
            continue  # answer accuracy is reported on its own; the pairwise kind is a reward model's signal
        if sig.first_last_k:
            values = (
                [v for _, v in out.reward_curve] if sig.key == keys.reward else [v for _, v in series(rows, sig.key)]
            )
            if not values:
                continue
            k = min(K, max(1, len(values) // 2))
            out.signal_start, out.signal_end = math.fsum(values[:k]) / k, math.fsum(values[-k:]) / k
            out.signal = sig.name.replace(f"first {K} steps -> last {K}", f"first {k} steps -> last {k}")
        else:
            values = [v for _, v in series(rows, sig.key)]
            if not values:
                continue
            out.signal_start, out.signal_end, out.signal = values[0], values[-1], sig.name
        out.signal_higher_is_better = sig.higher_is_better
        break
    for key in keys.extra:
        values = series(rows, key)
        if values:
            out.extra[key] = values[-1][1]
    out.rows, out.tokens = _total(stages, keys.rows), _total(stages, keys.tokens)
    out.step_s = _total(stages, "time/step")
    return out
