"""docs/serve.md's commands run as written (the port aside: a free one, so tests never collide)."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

from _lib.serve_helpers import free_port, running_server

ROOT = Path(__file__).resolve().parents[2]
DOC = (ROOT / "docs" / "serve.md").read_text()


def blocks(lang: str) -> list[str]:
    return re.findall(rf"^```{lang}\n(.*?)^```", DOC, flags=re.DOTALL | re.MULTILINE)


def test_the_quickstart_runs_as_written(tmp_path):
    command = blocks("bash")[0].strip()
    assert command == "trinity-like serve --port 8000"
    port = free_port()
    args = shlex.split(command)[2:]  # what follows `trinity-like serve`
    args[args.index("--port") + 1] = str(port)
    with running_server(tmp_path / "data", *args[2:], port=port):
        code = blocks("python")[0].replace("127.0.0.1:8000", f"127.0.0.1:{port}")
        result = subprocess.run(
            [sys.executable, "-c", code],
            check=False,
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=600,
            env={**os.environ, "HF_HUB_OFFLINE": "1", "TINKER_TELEMETRY": "0"},
        )
    assert result.returncode == 0, result.stderr[-3000:]
    loss, grad_norm = result.stdout.splitlines()[0].split()
    assert float(loss) > 0 and float(grad_norm) > 0
    assert result.stdout.splitlines()[1:]  # the sampled text


def test_every_cli_flag_is_in_the_options_table():
    from trinity_like.cli import build_parser

    serve = build_parser()._subparsers._group_actions[0].choices["serve"]
    flags = {s for a in serve._actions for s in a.option_strings if s.startswith("--")} - {
        "--help",
        "--debug",
        "--plugin",
    }
    table = set(re.findall(r"^\| `(--[a-z-]+)", DOC, flags=re.MULTILINE))
    assert flags == table
