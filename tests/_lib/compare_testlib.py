"""Shared by the compare tests: recipes shrunk to the tiny model, and running the CLI as a user does."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from filelock import FileLock

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


def tiny_compare(tmp_path_factory, name: str) -> tuple[Path, subprocess.CompletedProcess]:
    """docs/compare.md's first command, as written, shrunk to the tiny model and 2 seeds by appended
    flags: run once per test session, copied into a fresh folder for each caller (who may change it).

    Under xdist the workers share the session's temp root: the first to ask runs it, the others wait
    on the lock and copy its result, so the compare and view tests pay for one comparison, not three.
    """
    base = tmp_path_factory.getbasetemp()
    shared = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "tiny_compare"
    shared.mkdir(parents=True, exist_ok=True)
    done = shared / "done.json"
    with FileLock(str(shared / "lock")):
        if not done.exists():
            argv = doc_commands()[0]
            assert argv[:2] == ["trinity-like", "compare"], argv
            result = compare(
                *argv[2:], "--seeds", "2", *set_flags(TINY_SETS), "--out", str(shared / "out"), "--jobs", "2"
            )
            state = {
                "args": result.args,
                "returncode": result.returncode,
                "stdout": result.stdout,
                "stderr": result.stderr,
            }
            done.write_text(json.dumps(state))
    state = json.loads(done.read_text())
    result = subprocess.CompletedProcess(state["args"], state["returncode"], state["stdout"], state["stderr"])
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    out = tmp_path_factory.mktemp(name) / "compare_add2"
    shutil.copytree(shared / "out", out, symlinks=True)
    return out, result
