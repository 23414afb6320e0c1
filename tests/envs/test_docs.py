"""docs/envs.md runs as written: its example env, rolled out on the tiny model, and listed."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def python_blocks() -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", (ROOT / "docs" / "envs.md").read_text(), flags=re.S | re.M)


def test_the_example_env_runs(tmp_path):
    env_code, run_code = python_blocks()
    (tmp_path / "guess.py").write_text(env_code)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(tmp_path)}
    result = subprocess.run(
        [sys.executable, "-c", "import guess\n" + run_code],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    episodes, turns, reward = result.stdout.split()
    assert int(episodes) == 20 and 1 <= float(turns) <= 4 and 0 <= float(reward) <= 1
    listed = subprocess.run(
        [sys.executable, "-m", "trinity_like.cli", "list", "env", "--plugin", "guess.py"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert listed.returncode == 0, listed.stderr[-3000:]
    assert re.search(r"\n  guess_number +Guess the task's answer", listed.stdout), listed.stdout
