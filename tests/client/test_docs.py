"""The client's snippets in README.md and docs/client.md run as written, on the built-in SmolLM2."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def first_client_block(path: Path) -> str:
    blocks = re.findall(r"^```python\n(.*?)^```", path.read_text(), flags=re.S | re.M)
    return next(b for b in blocks if "import trinity_like.client as tinker" in b)


@pytest.mark.parametrize("doc", ["README.md", "docs/client.md"])
def test_snippet_runs_as_written(doc, tmp_path):
    code = first_client_block(ROOT / doc)
    result = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.strip().splitlines()
    assert float(lines[0].split()[0]) > 0  # loss:sum of the example


def test_the_rl_train_snippet_runs_as_written(tmp_path):
    text = (ROOT / "docs" / "client.md").read_text()
    blocks = re.findall(r"^```python\n(.*?)^```", text, flags=re.DOTALL | re.MULTILINE)
    code = next(b for b in blocks if "cookbook.rl.train import" in b)
    result = subprocess.run(
        [sys.executable, "-c", code],
        check=False,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    records, accuracy = result.stdout.split()
    assert int(records) == 3 and 0 <= float(accuracy) <= 1
    rows = (tmp_path / "runs" / "calc" / "metrics.jsonl").read_text().splitlines()
    assert len(rows) == 3 and (tmp_path / "runs" / "calc" / "checkpoints.jsonl").exists()
