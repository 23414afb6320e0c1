"""docs/serve.md's commands run as written (the port aside: a free one, so tests never collide)."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

from serve_helpers import free_port, running_server

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


def test_the_readme_lines_point_the_official_sdk_at_a_local_server(tmp_path):
    """README's two lines, as written: the command, the base_url and the key it names."""
    readme = (ROOT / "README.md").read_text().split("### The official `tinker` SDK over HTTP", 1)[1].split("\n## ")[0]
    command, client, export = re.findall(
        r"`(trinity-like serve[^`]*|tinker\.ServiceClient\([^`]*\)|export [^`]*)`", readme
    )
    assert command == "trinity-like serve --port 8000" and client.endswith('(base_url="http://127.0.0.1:8000")')
    key, value = export.removeprefix("export ").split("=")
    port = free_port()
    args = shlex.split(command)[2:]
    args[args.index("--port") + 1] = str(port)
    code = (
        f"import tinker\nservice = {client.replace('127.0.0.1:8000', f'127.0.0.1:{port}')}\n"
        "print(len(service.get_server_capabilities().supported_models))\nservice.close('success').result()\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "TINKER_API_KEY"}
    with running_server(tmp_path / "data", *args[2:], port=port):
        result = subprocess.run(
            [sys.executable, "-c", code],
            check=False,
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=300,
            env={**env, key: value, "TINKER_TELEMETRY": "0"},
        )
    assert result.returncode == 0, result.stderr[-3000:]
    assert int(result.stdout.split()[0]) >= 2  # the built-in models
