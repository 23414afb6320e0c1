"""The README's commands run as written and its links resolve.

- its first shell block holds exactly two commands, both behind the same set-up: the first runs the
  main job, the second the test suite (`.ci/run` runs that line, set-up included, in a fresh virtual
  environment; the charter asks for these two first);
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


def test_the_readme_starts_with_the_main_job_and_the_test_command():
    text = README.read_text()
    main_job, tests = shell_blocks(text)[0]  # exactly two commands
    setup, run = (part.strip() for part in main_job.split("&&", 1))
    assert setup == "bash scripts/setup.sh" and (ROOT / "scripts" / "setup.sh").is_file()
    assert run.split()[:3] == ["trinity-like", "run", "--config"] and (ROOT / run.split()[3]).is_file()
    assert tests.split("&&", 1)[0].strip() == setup  # .ci/run takes the set-up from the test line
    assert tests.split("&&", 1)[1].split()[:3] == ["python", "-m", "pytest"]  # every tier: no -m, no path
    assert " -m " not in tests.split("pytest", 1)[1] and "tests/" not in tests
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
