"""Two recipe mistakes that used to run, or end in a traceback, refused up front by ``run``,
``validate`` and ``run --dry-run`` alike: one line naming the recipe's file, line and key, exit
status 2, nothing written.

- ``buffer.train_batch_size`` that is not a whole number of groups (``explorer.group_size``)
  for an algorithm whose advantage normalises over groups: before, 12 rows a step with groups
  of 8 ran, each step's group advantage seeing one and a half groups.
- ``run_root`` that is a file, lies under a file, or is a folder this user cannot write in:
  before, a 15-line ``NotADirectoryError`` traceback from the run lock (and ``validate`` and
  ``--dry-run`` said ok). Read-only is checked as the operating system answers for the
  process (``os.access``); root ignores permission bits, so as root the test makes the
  folder read-only with a read-only bind mount in a mount namespace of its own (``unshare``),
  and as another user with ``chmod``; where neither can be done the case is skipped.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from _lib.faultlib import child_env, record

RECIPE = """\
name: guarded
model:
  path: tiny-random
algorithm:
  type: grpo
buffer:
  train_batch_size: 16
  tasks:
    path: data.jsonl
explorer:
  batch_size: 2
  group_size: 8
trainer:
  engine: local
  total_steps: 1
"""
COMMANDS = {  # the three doors that read a recipe
    "run": ["run", "--config", "r.yaml"],
    "validate": ["validate", "r.yaml"],
    "dry-run": ["run", "--dry-run", "--config", "r.yaml"],
}


def _folder(tmp_path: Path, recipe: str = RECIPE) -> Path:
    folder = tmp_path / "w"
    folder.mkdir()
    (folder / "r.yaml").write_text(recipe)
    (folder / "data.jsonl").write_text('{"prompt": "What is 2 + 2?", "answer": "4"}\n')
    return folder


def _snapshot(folder: Path) -> set[str]:
    return {str(p.relative_to(folder)) for p in folder.rglob("*")}


def _cli(folder: Path, args: list[str], wrap: list[str] | None = None) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "trinity_like.cli", *args]
    return subprocess.run((wrap or []) + cmd, cwd=folder, capture_output=True, text=True, timeout=120, env=child_env())


def _refused_everywhere(folder: Path, overrides: list[str], expect: str, wrap: list[str] | None = None) -> None:
    """Each door: exit 2, exactly one line matching ``expect``, nothing written in ``folder``."""
    before = _snapshot(folder)
    for door, args in COMMANDS.items():
        out = _cli(folder, args + overrides, wrap)
        lines = out.stderr.splitlines()
        assert out.returncode == 2 and len(lines) == 1, (door, out.returncode, out.stderr[-3000:])
        assert re.fullmatch("trinity-like: error: " + expect, lines[0]), (door, lines[0])
        assert _snapshot(folder) == before, door


def test_a_batch_of_part_groups_is_refused_with_its_line(tmp_path: Path, record_property) -> None:
    folder = _folder(tmp_path, RECIPE.replace("train_batch_size: 16", "train_batch_size: 12"))
    _refused_everywhere(
        folder,
        [],
        r"r\.yaml:7: buffer\.train_batch_size: 12 rows per train step is not a whole number of groups of "
        r"explorer\.group_size=8 \(advantage 'grpo' normalises over groups; a batch holds whole groups\): "
        r"use a multiple of 8, e\.g\. 8 or 16",
    )
    # set on the command line, the override is named; an algorithm without groups takes any size
    _refused_everywhere(
        folder,
        ["buffer.train_batch_size=20"],
        r"r\.yaml: override 'buffer\.train_batch_size=20': buffer\.train_batch_size: 20 rows .* e\.g\. 16 or 24",
    )
    ok = _cli(folder, ["validate", "r.yaml", "algorithm.type=reinforce_plus_plus"])
    assert ok.returncode == 0, ok.stderr[-3000:]
    record(
        record_property,
        "buffer.train_batch_size=12 with explorer.group_size=8 (GRPO): a batch of one and a half groups",
        "one line naming r.yaml:7 and the key, exit 2, in run, validate and --dry-run; nothing written",
        "-",
        "-",
    )


def test_a_run_root_that_is_a_file_or_under_one_is_refused_with_its_key(tmp_path: Path, record_property) -> None:
    folder = _folder(tmp_path)
    (folder / "afile").write_text("not a folder\n")
    (folder / "runs").mkdir()
    (folder / "runs" / "guarded").write_text("a file where the run directory goes\n")
    cases = {
        "run_root=afile": r"afile is a file: the run directory cannot be made there \(the run directory is afile/guarded\)",
        "run_root=afile/sub": r"afile is a file: the run directory cannot be made there "
        r"\(the run directory is afile/sub/guarded\)",
    }
    for override, message in cases.items():
        _refused_everywhere(folder, [override], rf"r\.yaml: override '{re.escape(override)}': run_root: {message}")
    # the run directory itself is a file: the key that names it is `name`, on line 1
    _refused_everywhere(folder, [], r"r\.yaml:1: name: runs/guarded is a file: the run directory cannot be made there")
    record(
        record_property,
        "run_root a file; run_root under a file (afile/sub); the run directory (run_root/name) a file",
        "one line naming the key (and the recipe line or override), exit 2, in run, validate and --dry-run; "
        "nothing written (before: a 15-line NotADirectoryError traceback; validate said ok)",
        "-",
        "-",
    )


def _read_only(folder: Path) -> list[str] | None:
    """How to run a command that sees ``folder`` read-only: a prefix for the command line
    (as root: a read-only bind mount in a private mount namespace), [] after ``chmod`` (not
    root: permission bits bind), None where neither can be done."""
    if os.geteuid() != 0:
        folder.chmod(0o555)
        return []
    unshare = shutil.which("unshare")
    if unshare is None:
        return None
    mount = f'mount --bind -o ro {folder} {folder} && exec "$@"'
    wrap = [unshare, "-m", "--propagation", "private", "sh", "-c", mount, "sh"]
    probe = subprocess.run(wrap + ["sh", "-c", f"! touch {folder}/probe"], capture_output=True, timeout=30)
    return wrap if probe.returncode == 0 and not (folder / "probe").exists() else None


def test_a_run_root_this_user_cannot_write_is_refused(tmp_path: Path, record_property) -> None:
    folder = _folder(tmp_path)
    locked = folder / "locked"
    locked.mkdir()
    wrap = _read_only(locked)
    if wrap is None:
        pytest.skip("cannot make a folder read-only here (root without unshare / mount namespaces)")
    try:
        _refused_everywhere(
            folder,
            [f"run_root={locked}"],
            rf"r\.yaml: override 'run_root={re.escape(str(locked))}': run_root: {re.escape(str(locked))}: folder "
            rf"not writable by this user \(the run directory {re.escape(str(locked))}/guarded would be made in it\)",
            wrap,
        )
    finally:
        locked.chmod(0o755)
    how = "as root: a read-only bind mount, since root ignores permission bits" if wrap else "chmod 555"
    record(
        record_property,
        f"run_root a folder this user cannot write in ({how})",
        "one line naming the key, exit 2, in run, validate and --dry-run; nothing written",
        "-",
        "-",
    )
