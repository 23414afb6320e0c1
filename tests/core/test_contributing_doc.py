"""docs/contributing.md's pytest commands run as written, each narrowed to a few files by an appended path,
and the tiers they select are the ones the page describes (tests/_lib/tiers.py decides them)."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "contributing.md"
# one small file per tier, and what the page says each holds: a loss check, a CLI run, a Ray client (on a
# cluster started with `ray start`); each quick to collect (a collection of the three takes a few seconds)
FILES = {"unit": "tests/core/test_registry.py", "integration": "tests/core/test_readme.py"}
FILES["system"] = "tests/client_ray/test_existing_cluster.py"


def shown() -> list[str]:
    """Every pytest command on the page: in its shell blocks and in backticks."""
    text = DOC.read_text(encoding="utf-8")
    blocks = re.findall(r"^```bash\n(.*?)^```", text, flags=re.S | re.M)
    lines = [line.strip() for b in blocks for line in b.splitlines() if line.strip()]
    return lines + [c for c in re.findall(r"`(python -m pytest [^`]*)`", text) if c not in lines]


def pytest_in(argv: list[str]) -> subprocess.CompletedProcess:
    assert argv[:3] == ["python", "-m", "pytest"], argv
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "RAY_AUTH_MODE": "disabled"}
    cmd = [sys.executable, *argv[1:], "-p", "no:cacheprovider"]
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600, check=False)


def collected(out: str, file: str) -> int:
    """Tests of ``file`` listed by ``--collect-only``: one a line (``-q``) or a count per file (``-qq``)."""
    per_file = re.findall(rf"^{re.escape(file)}: (\d+)$", out, flags=re.M)
    return sum(map(int, per_file)) + sum(line.startswith(f"{file}::") for line in out.splitlines())


def test_the_page_shows_the_fast_loop_with_coverage_and_every_tier():
    commands = shown()
    assert any("-m unit" in c and "--cov=trinity_like" in c for c in commands)
    assert {tier for tier in FILES if any(f"-m {tier}" in c for c in commands)} == set(FILES)


@pytest.mark.parametrize("command", shown())
def test_each_command_selects_its_tier(command):
    """Collected (not run) on one file of each tier, all three in one collection (a pytest start costs
    seconds): the command's mark takes its tier's file and no other."""
    argv = [a for a in shlex.split(command) if not a.startswith("--cov")]
    options = argv[3:]  # after python -m pytest
    tier = options[options.index("-m") + 1] if "-m" in options else None
    argv = [a for a in argv if not a.startswith("tests/")]
    done = pytest_in([*argv, "--collect-only", *FILES.values()])
    assert done.returncode in (0, 5), done.stdout[-3000:] + done.stderr[-3000:]
    for want, file in FILES.items():
        assert bool(collected(done.stdout, file)) == (tier in (None, want)), (command, file, done.stdout[-2000:])


def test_the_fast_loop_runs_and_reports_coverage_of_the_core():
    (command,) = [c for c in shown() if "--cov=trinity_like" in c]
    done = pytest_in([*shlex.split(command), FILES["unit"]])
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert re.search(r"^trinity_like/registry\.py\s+\d+\s+\d+\s+\d+%", done.stdout, flags=re.M), done.stdout[-3000:]
    assert re.search(r"^TOTAL\s+\d+\s+\d+\s+\d+%", done.stdout, flags=re.M)
