"""The README is a front page, and every command it shows runs as written.

- at most 150 lines; its first shell block holds exactly the two set-up commands
  (`.ci/run` runs the second one, set-up included, in a fresh virtual environment);
- every link and picture points to a file inside the repository;
- every other shell command runs here as written (exit status 0), the main job's shrunk
  to the tiny model by appending overrides; the Python block runs in tests/client/test_docs.py.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
TINY_RUN = [
    "model.path=tiny-random",
    "trainer.engine=local",
    "trainer.total_steps=1",
    "explorer.batch_size=2",
    "explorer.group_size=4",
    "buffer.eval_tasks.size=4",
    "monitor.progress=false",
]


def shell_blocks(text: str) -> list[list[str]]:
    blocks = re.findall(r"```bash\n(.*?)```", text, flags=re.S)
    return [[line.split(" #")[0].strip() for line in b.splitlines() if line.strip()] for b in blocks]


def test_readme_is_a_front_page():
    text = README.read_text()
    assert len(text.splitlines()) <= 150
    first = shell_blocks(text)[0]
    assert first == [
        "bash scripts/setup.sh && trinity-like run --config examples/grpo_arith.yaml",
        "bash scripts/setup.sh && python -m pytest -q -n 2 --dist loadgroup",
    ]
    assert text.index("```bash") < text.index("\n## "), "the two commands come first"


def test_every_link_stays_inside_the_repository():
    text = README.read_text()
    links = re.findall(r"\]\(([^)]+)\)", text)
    assert links
    for link in links:
        assert "://" not in link and not link.startswith(("/", "..")), link
        target = (ROOT / link.split("#")[0]).resolve()
        assert target.is_relative_to(ROOT) and target.exists(), link
    for path in re.findall(r"`((?:docs|benchmarks|examples|plugins|trinity_like|cookbook|algorithms)/[^`\s]*)`", text):
        assert (ROOT / path.split("#")[0].rstrip(",.")).exists(), path


def commands() -> list[str]:
    return [line for block in shell_blocks(README.read_text())[1:] for line in block]


@pytest.mark.parametrize("command", commands())
def test_readme_command_runs_as_written(command, tmp_path):
    argv = shlex.split(command)
    assert argv[0] == "trinity-like", command
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "RAY_AUTH_MODE": "disabled"}
    r = subprocess.run(
        [sys.executable, "-m", "trinity_like.cli", *argv[1:]],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip()


def test_the_main_job_command_runs_on_the_tiny_model(tmp_path):
    main_job = shell_blocks(README.read_text())[0][0].split("&&")[1].split()
    assert main_job[:3] == ["trinity-like", "run", "--config"]
    r = subprocess.run(
        [sys.executable, "-m", "trinity_like.cli", *main_job[1:], f"run_root={tmp_path}", *TINY_RUN],
        cwd=ROOT,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "RAY_AUTH_MODE": "disabled"},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert (tmp_path / "grpo_arith" / "metrics.jsonl").read_text().count("\n") >= 1
