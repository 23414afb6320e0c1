"""Real runs for fault tests: the default recipe on the tiny model as a child process.

A fault test starts ``trinity-like run`` as a user would (its own process, so a SIGKILL
is a real one), breaks it, runs the same command again, and checks the run directory
against an oracle that does not trust the run's own bookkeeping: the buffer's rows per
step (none lost, none trained twice) and the per-step rewards of an uninterrupted run.

Each test reports what it showed with :func:`record` (pytest's ``record_property``), which
``python tests/faults/report.py`` turns into the table of docs/reliability.md.
"""

from __future__ import annotations

import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from trinity_like.buffer.rows import STATUSES

REPO = Path(__file__).resolve().parents[2]
RECIPE = REPO / "examples" / "grpo_arith.yaml"
BATCH, GROUP = 2, 4  # prompts x samples: 8 rows per step
TINY = [
    "model.path=tiny-random",
    "trainer.engine=local",
    "buffer.eval_tasks.size=4",
    f"explorer.batch_size={BATCH}",
    f"explorer.group_size={GROUP}",
    "monitor.progress=false",
    "monitor.eval_at_start=false",
    "checkpoint.interval=1",
    "checkpoint.keep_last=10",
    "algorithm.dynamic_sampling=false",  # every explored row is trained: rows per step are exact
    # the random tiny model never answers right: reward "contains a digit", so rewards vary
    "explorer.reward_fn=format",
    "explorer.reward_args={pattern: '.*[0-9].*'}",
    "explorer.eval_reward_fn=exact_match",
]
STEPS = 3  # steps of the runs that are broken and resumed (tests/faults/conftest.py: the uninterrupted one)
FAULT_ENV = "TRINITY_LIKE_FAULT"  # trinity_like.pipeline.checkpoint.FAULT_ENV (a point name: SIGKILL there)


def command(run_root: Path, *overrides: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "trinity_like.cli",
        "run",
        "--config",
        str(RECIPE),
        f"run_root={run_root}",
        *TINY,
        *overrides,
    ]


def child_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != FAULT_ENV}
    return {**env, "RAY_AUTH_MODE": "disabled", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", **extra}


def run(cmd: list[str], timeout: float = 120, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=child_env(**env))


def start(cmd: list[str], **env: str) -> subprocess.Popen:
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=child_env(**env))


def wait_for(cond: Callable[[], bool], timeout: float, proc: subprocess.Popen | None = None) -> float:
    """Seconds until ``cond()`` holds (AssertionError after ``timeout`` or when ``proc`` ends first)."""
    t0 = time.monotonic()
    while not cond():
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"the run ended (status {proc.returncode}) first: {proc.stderr.read()[-2000:]}")
        if time.monotonic() - t0 > timeout:
            raise AssertionError(f"not within {timeout} s")
        time.sleep(0.1)
    return time.monotonic() - t0


def kill(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=30)


def restart_lines(text: str) -> list[str]:
    """The run's ``restart N of M: ...`` lines in a process's output. The run writes each in one
    write of its own (monitor/logger.py), but a "(raylet)" report Ray prints from a background
    thread may have left the line it was on unfinished: a restart line is read from where it starts."""
    return re.findall(r"restart \d+ of \d+: [^\n]*", text)


def one_line_error(out: subprocess.CompletedProcess) -> str:
    """The run's stderr, which must be exactly one ``trinity-like: error:`` line."""
    lines = out.stderr.splitlines()
    assert out.returncode == 2 and len(lines) == 1 and lines[0].startswith("trinity-like: error: "), out.stderr[-3000:]
    return lines[0]


def rows_by_step(run_dir: Path) -> dict[Any, int]:
    """Buffer rows consumed per training step, plus ``"available"`` / ``"claimed"`` counts."""
    db = sqlite3.connect(f"file:{run_dir / 'buffer.sqlite'}?mode=ro", uri=True)
    try:
        out: dict[Any, int] = {}
        for status, step, n in db.execute("SELECT status, step, COUNT(*) FROM state GROUP BY status, step"):
            name = STATUSES[status]
            key = step if name == "consumed" else name
            out[key] = out.get(key, 0) + n
        return out
    finally:
        db.close()


def consumed_batches(run_dir: Path) -> dict[int, list[tuple[str, int, float]]]:
    """What each step trained on, by content: ``(task_id, model_version, reward)`` of its
    consumed rows, sorted. Row ids cannot show a batch trained twice when the second copy is
    a re-explored row with a new id; this can."""
    db = sqlite3.connect(f"file:{run_dir / 'buffer.sqlite'}?mode=ro", uri=True)
    try:
        out: dict[int, list[tuple[str, int, float]]] = {}
        for status, step, header in db.execute(
            "SELECT s.status, s.step, r.header FROM state s JOIN rows r USING (seq)"
        ):
            if STATUSES[status] == "consumed":
                row = json.loads(header)
                out.setdefault(step, []).append((row["task_id"], row["model_version"], row["reward"]))
        return {step: sorted(rows) for step, rows in sorted(out.items())}
    finally:
        db.close()


def split_groups(run_dir: Path) -> dict[int, list[str]]:
    """Per training step, the groups of which it consumed a part (or whose rows do not carry
    the recipe's ``GROUP`` as their group's size): empty when every step trained whole groups."""
    db = sqlite3.connect(f"file:{run_dir / 'buffer.sqlite'}?mode=ro", uri=True)
    try:
        counts: dict[int, dict[tuple[str, int], int]] = {}
        for status, step, header in db.execute(
            "SELECT s.status, s.step, r.header FROM state s JOIN rows r USING (seq)"
        ):
            if STATUSES[status] == "consumed":
                row = json.loads(header)
                key = (row["group_id"], row.get("group_size", 0))
                counts.setdefault(step, {})[key] = counts.setdefault(step, {}).get(key, 0) + 1
        return {
            step: [f"{gid}: {n} of {size}" for (gid, size), n in groups.items() if n != size or size != GROUP]
            for step, groups in sorted(counts.items())
            if any(n != size or size != GROUP for (_, size), n in groups.items())
        }
    finally:
        db.close()


def step_metrics(run_dir: Path, key: str) -> dict[int, float]:
    """``key`` of every trained step in metrics.jsonl (a resumed step's last line wins)."""
    out: dict[int, float] = {}
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        row = json.loads(line)
        if key in row and "time/rollout" in row:
            out[int(row["step"])] = row[key]
    return out


def trained_steps(run_dir: Path) -> list[int]:
    return [
        int(json.loads(line)["step"])
        for line in (run_dir / "metrics.jsonl").read_text().splitlines()
        if "time/rollout" in json.loads(line)
    ]


def record(record_property: Callable[[str, Any], None], fault: str, outcome: str, resumed: str, rows: str) -> None:
    """One row of the fault table: what was injected, what the run did, whether the same
    command resumed it, and the buffer rows lost / trained twice."""
    for key, value in (("fault", fault), ("outcome", outcome), ("resumed", resumed), ("rows", rows)):
        record_property(key, value)


def check_resumed(run_dir: Path, straight: Path, steps: int = STEPS) -> None:
    """After a resume: every checkpoint left verifies, each step consumed exactly its
    ``BATCH * GROUP`` buffer rows (none lost, none twice, none left claimed, none by a step
    that never was), and every step's mean reward, logged, equals the uninterrupted run's."""
    from trinity_like.pipeline.checkpoint import CheckpointManager

    mgr = CheckpointManager(run_dir)
    for path in mgr.list():
        mgr.verify(path)
    expected = {s: BATCH * GROUP for s in range(1, steps + 1)}
    rows = rows_by_step(run_dir)
    assert {s: rows.get(s) for s in range(1, steps + 1)} == expected, rows
    assert rows.get("claimed", 0) == 0
    assert set(rows) - {"available"} == set(expected), rows
    assert step_metrics(run_dir, "reward/mean") == step_metrics(straight, "reward/mean")
