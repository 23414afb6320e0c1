"""docs/view.md's `trinity-like view` / `report` / `plot` commands run as written (on tiny runs in the folders they name)."""

from __future__ import annotations

import json
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from tiny_runs import run

ROOT = Path(__file__).resolve().parents[2]


def doc_commands() -> list[list[str]]:
    blocks = re.findall(r"```bash\n(.*?)```", ROOT.joinpath("docs", "view.md").read_text(), flags=re.S)
    return [line.split("#")[0].split() for block in blocks for line in block.splitlines() if line.strip()]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_doc_view_report_and_plot_commands_run_as_written(tmp_path):
    commands = doc_commands()
    assert [c[1] for c in commands] == ["view", "view", "report", "plot", "plot"]
    made = run(tmp_path, "trainer.total_steps=1")  # runs/grpo_arith
    assert made == tmp_path / "grpo_arith"
    (tmp_path / "runs").mkdir()
    made.rename(tmp_path / "runs" / "grpo_arith")
    shutil.copytree(tmp_path / "runs" / "grpo_arith", tmp_path / "runs" / "dapo")
    cli = [sys.executable, "-m", "trinity_like.cli"]
    for command in commands:
        args = command[1:]
        if args[0] == "report":
            r = subprocess.run(cli + args, cwd=tmp_path, capture_output=True, text=True)
            assert r.returncode == 0, r.stderr
            assert "window.REPORT" in (tmp_path / args[args.index("--out") + 1]).read_text()
            continue
        if args[0] == "plot":  # the PNG its comment names
            r = subprocess.run(cli + args, cwd=tmp_path, capture_output=True, text=True)
            assert r.returncode == 0, r.stderr
            png = tmp_path / r.stdout.strip().splitlines()[-1]
            assert png.name in ("metrics.png", "timeline.png") and png.read_bytes()[:4] == b"\x89PNG"
            continue
        port = free_port()  # the default 8420 may be taken on a CI machine
        proc = subprocess.Popen(cli + args + ["--port", str(port)], cwd=tmp_path, stdout=subprocess.PIPE, text=True)
        try:
            assert proc.stdout.readline().startswith(f"trinity-like view: http://127.0.0.1:{port}/")
            deadline = time.monotonic() + 30
            while socket.socket().connect_ex(("127.0.0.1", port)) and time.monotonic() < deadline:
                time.sleep(0.1)
            runs = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{port}/api/runs").read())
            assert [Path(r["path"]).name for r in runs] == [Path(a).name for a in args[1:]]
        finally:
            proc.terminate()
            proc.wait(timeout=10)
