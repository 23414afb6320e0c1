"""Shared by the compare tests: recipes shrunk to the tiny model, and running the CLI as a user does."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# Every recipe shrunk to seconds: the tiny model, the local engine, 2 steps, small batches. A random
# tiny model never answers right: it is rewarded for "contains a digit" so that groups differ and
# every step trains; held-out accuracy stays exact match.
TINY_SETS = [
    "model.path=tiny-random",
    "trainer.engine=local",
    "trainer.total_steps=2",
    "buffer.eval_tasks.size=4",
    "explorer.batch_size=2",
    "explorer.group_size=4",
    "explorer.reward_fn=format",
    "explorer.reward_args={pattern: '.*[0-9].*'}",
    "explorer.eval_reward_fn=exact_match",
]


def set_flags(sets: list[str]) -> list[str]:
    return [f"--set={s}" for s in sets]


def compare(*args: str, timeout: float = 900) -> subprocess.CompletedProcess:
    """``trinity-like compare ARGS`` in a subprocess, from the repository root."""
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "HF_HUB_OFFLINE": "1"}
    return subprocess.run(
        [sys.executable, "-m", "trinity_like.cli", "compare", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def report(out: Path) -> dict:
    return json.loads((out / "compare.json").read_text())


def metrics(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


DOC = ROOT / "docs" / "compare.md"


def doc_blocks(lang: str) -> list[str]:
    import re

    return re.findall(rf"^```{lang}\n(.*?)^```", DOC.read_text(), flags=re.DOTALL | re.MULTILINE)


def doc_commands() -> list[list[str]]:
    """Every command of docs/compare.md's bash blocks, split as a shell would."""
    import shlex

    return [shlex.split(line) for block in doc_blocks("bash") for line in block.splitlines() if line.strip()]
