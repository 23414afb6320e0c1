"""Hostile recipes through the real CLI: files that never end or never open, aliases that never stop expanding.

Each case runs `trinity-like run --config ...` in a child process under a time bound (a FIFO
used to block for ever, `/dev/zero` to be read without end, a 700-byte "billion laughs" to
run past 120 s) and checks the whole contract: exit status 2, one line on stderr naming the
file (and line), no run directory, nothing written in the working folder.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

from _lib.faultlib import child_env, record

GRPO = """\
name: bad
model:
  path: tiny-random
algorithm:
  type: grpo
buffer:
  tasks:
    path: data.jsonl
trainer:
  engine: local
  total_steps: 1
"""


def laughs(levels: int = 9) -> str:
    """Nested aliases: 9 levels of 9 references each expand to 9^9 (387 million) strings."""
    text = "a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n"
    for prev, name in zip("abcdefghi", "bcdefghij"[: levels - 1]):
        text += f"{name}: &{name} [{', '.join(['*' + prev] * 9)}]\n"
    return text


CASES = {  # id -> (how the folder is made, the message after "trinity-like: error: ")
    "recipe_fifo": ("fifo:r.yaml", r"r\.yaml: not a regular file \(a FIFO\); a recipe is read from a file"),
    "recipe_dev_zero": (
        "link:r.yaml:/dev/zero",
        r"r\.yaml: not a regular file \(a device\); a recipe is read from a file",
    ),
    "recipe_too_large": (
        "big:r.yaml",
        r"r\.yaml: larger than 4 MB; a recipe is read up to 4 MB",
    ),
    "yaml_recursive_alias": (
        "text:r.yaml:" + GRPO + "stages: &s\n  - name: a\n    x: *s\n",
        r"r\.yaml:14: alias \*s is inside the node &s it names \(a recursive alias\)",
    ),
    "yaml_billion_laughs": (
        "text:r.yaml:" + GRPO + laughs(),
        r"r\.yaml:\d+: alias \*\w: aliases expand to more than 10000 nodes in all .*",
    ),
    "data_fifo": (
        "fifo:data.jsonl",
        r"r\.yaml:8: buffer\.tasks\.path: .*data\.jsonl: not a regular file \(a FIFO, device or socket\); .*",
    ),
}


def make(folder: Path, how: str) -> None:
    kind, name, *rest = how.split(":", 2)
    if name != "r.yaml":
        (folder / "r.yaml").write_text(GRPO)
    if kind == "fifo":
        os.mkfifo(folder / name)
    elif kind == "link":
        os.symlink(rest[0], folder / name)
    elif kind == "big":
        (folder / name).write_text(GRPO + "#" * (5 * 2**20))
    else:
        (folder / name).write_text(rest[0])
    if name != "data.jsonl":
        (folder / "data.jsonl").write_text('{"prompt": "What is 2 + 2?", "answer": "4"}\n')


def snapshot(folder: Path) -> set[str]:
    return {str(p.relative_to(folder)) for p in folder.rglob("*")}


def run_case(case: str, folder: Path) -> float:
    """Run ``case`` in ``folder`` (made for it); the seconds it took. Asserts the whole contract."""
    how, expect = CASES[case]
    folder.mkdir()
    make(folder, how)
    before = snapshot(folder)
    t0 = time.monotonic()
    out = subprocess.run(
        [sys.executable, "-m", "trinity_like.cli", "run", "--config", "r.yaml"],
        cwd=folder,
        capture_output=True,
        text=True,
        timeout=120,
        env=child_env(),
    )
    took = time.monotonic() - t0
    lines = out.stderr.splitlines()
    assert out.returncode == 2 and len(lines) == 1, (case, out.stderr[-3000:])
    assert re.fullmatch("trinity-like: error: " + expect, lines[0]), (case, lines[0])
    assert snapshot(folder) == before, case  # no run directory, nothing else
    return took


def test_recipe_and_data_files_that_never_end_or_never_open(tmp_path: Path, record_property) -> None:
    cases = ["recipe_fifo", "recipe_dev_zero", "recipe_too_large", "data_fifo"]
    took = max(run_case(case, tmp_path / case) for case in cases)
    record(
        record_property,
        "a FIFO as --config or as a data file, --config /dev/zero, a recipe of 5 MB",
        f"clean one-line error naming the file (a data file: with the recipe's line and key), exit 2, "
        f"nothing written: {len(cases)}/{len(cases)} (slowest {took:.0f} s)",
        "-",
        "-",
    )


def test_yaml_aliases_that_never_stop_expanding(tmp_path: Path, record_property) -> None:
    cases = ["yaml_recursive_alias", "yaml_billion_laughs"]
    took = max(run_case(case, tmp_path / case) for case in cases)
    assert took < 60
    record(
        record_property,
        "a self-referencing YAML alias; a 'billion laughs' recipe (nested aliases, 9^9 nodes)",
        f"clean one-line error naming the file and line, exit 2, nothing written: {len(cases)}/{len(cases)} "
        f"(slowest {took:.0f} s)",
        "-",
        "-",
    )
