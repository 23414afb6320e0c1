"""What the model answered at each held-out evaluation: ``<run_dir>/evals.jsonl``.

``metrics.jsonl`` keeps an evaluation's mean; this file keeps its items, one JSON object
per line, so a person can follow one held-out problem across the run (what did the model
answer at step 0, 10, 20?). ``step`` is the trainer step whose weights answered. Two kinds::

    {"step": 10, "kind": "answer", "task_id": "arith-eval-0-3", "prompt": "What is 17 + 5?",
     "answer": "22", "response": "17 + 5 = 22", "reward": 1.0, "finish_reason": "stop", "length": 9}
    {"step": 10, "kind": "pair", "task_id": "pair-7", "prompt": "...", "chosen": "...", "rejected": "...",
     "metrics": {"reward_chosen": 0.12, "reward_rejected": -0.03, "reward_margin": 0.15, ...}}

A pair's ``metrics`` are what the run's pair loss reports for that pair alone (DPO's
implicit rewards and margin, a reward model's margin), and each per-row output of the
model for its two rows (a reward model's ``scores_chosen`` / ``scores_rejected``). Lines are
appended and flushed per evaluation; a torn last line (a killed run) is skipped when read.

A DPO or reward-model stage also appends each *training* pair of each step, in the same
``pair`` format, to ``<run_dir>/trained_pairs.jsonl``: the scores the step's own forward
gave before its update (no extra pass). A resumed run writes its steps again; readers keep
the last writing of each pair of a step.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

EVALS_FILE = "evals.jsonl"
TRAINED_PAIRS_FILE = "trained_pairs.jsonl"


def append_evals(path: str | os.PathLike, step: int, items: Iterable[dict[str, Any]]) -> None:
    """Append one evaluation's ``items`` (each gets ``"step": step`` first)."""
    text = "".join(json.dumps({"step": step, **item}) + "\n" for item in items)
    if not text:
        return
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())


def read_jsonl(path: str | os.PathLike) -> list[dict[str, Any]]:
    """Every complete record of a JSON Lines file (a torn last line left by a kill is skipped)."""
    rows = []
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            if not line.endswith("\n"):
                break
            if line.strip():
                rows.append(json.loads(line))
    return rows
