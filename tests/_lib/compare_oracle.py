"""The oracle of the view's comparison curves: each entry's mean over seeds and its 95 % Student-t interval
at every step, computed from the runs' own ``metrics.jsonl`` with ``json`` and ``scipy.stats.t.interval``
(not with the comparison's statistics)."""

from __future__ import annotations

import json
from pathlib import Path

from scipy import stats


def oracle(folder: Path, key: str) -> dict[str, dict[int, tuple[float, float | None, float | None, int]]]:
    """``label -> step -> (mean, low, high, n)`` of ``key`` over the finished runs, from their metrics files
    (a run folder that is gone, and a line that is not JSON, are left out)."""
    report = json.loads((folder / "compare.json").read_text())
    by: dict[str, dict[int, list[float]]] = {e["label"]: {} for e in report["entries"]}
    for r in report["runs"]:
        if r["status"] not in ("done", "reused"):
            continue
        path = folder / "runs" / r["label"] / f"seed_{r['seed']}" / "metrics.jsonl"
        last: dict[int, float] = {}  # a step logged again (a resumed run's redo): its latest value
        for line in path.open() if path.is_file() else []:
            try:
                row = json.loads(line)
            except ValueError:
                continue
            if isinstance(row.get(key), (int, float)):
                last[row["step"]] = float(row[key])
        for step, value in last.items():
            by[r["label"]].setdefault(step, []).append(value)
    out: dict[str, dict[int, tuple]] = {}
    for label, steps in by.items():
        out[label] = {}
        for step, values in sorted(steps.items()):
            mean = sum(values) / len(values)
            if len(values) < 2:
                out[label][step] = (mean, None, None, 1)
                continue
            sem = stats.sem(values)
            low, high = stats.t.interval(0.95, len(values) - 1, loc=mean, scale=sem) if sem > 0 else (mean, mean)
            out[label][step] = (mean, low, high, len(values))
    return out
