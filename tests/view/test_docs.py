"""docs/view.md's `trinity-like view` / `report` / `plot` commands run as written (on tiny runs in the folders they
name), and docs/compare.md's `view` / `report` of a comparison folder."""

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

from _lib.tiny_runs import run

ROOT = Path(__file__).resolve().parents[2]


def doc_commands() -> list[list[str]]:
    blocks = re.findall(r"```bash\n(.*?)```", ROOT.joinpath("docs", "view.md").read_text(), flags=re.S)
    return [line.split("#")[0].split() for block in blocks for line in block.splitlines() if line.strip()]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_doc_view_report_and_plot_commands_run_as_written(tmp_path, compare_dir):
    commands = doc_commands()
    assert commands and all(c[1] in ("view", "report", "plot") for c in commands)  # check_commands runs each
    made = run(tmp_path, "trainer.total_steps=1")  # runs/grpo_arith
    assert made == tmp_path / "grpo_arith"
    (tmp_path / "runs").mkdir()
    made.rename(tmp_path / "runs" / "grpo_arith")
    shutil.copytree(tmp_path / "runs" / "grpo_arith", tmp_path / "runs" / "dapo")
    shutil.copytree(compare_dir, tmp_path / "runs" / "compare_add2")  # a comparison of 2 entries x 2 seeds
    check_commands(commands, tmp_path)


def test_compare_docs_view_and_report_commands_run_as_written(tmp_path, compare_dir):
    from _lib.compare_testlib import doc_commands as compare_doc_commands

    commands = [c for c in compare_doc_commands() if c[1] in ("view", "report")]
    assert commands and all(c[2] == "runs/compare_add2" for c in commands)  # the comparison copied here
    shutil.copytree(compare_dir, tmp_path / "runs" / "compare_add2")
    check_commands(commands, tmp_path)


def shown_runs(folder: Path) -> list[str]:
    """The folder names of the runs the page lists for ``folder``: itself, or a comparison's finished runs."""
    if not (folder / "compare.json").is_file():
        return [folder.name]
    report = json.loads((folder / "compare.json").read_text())
    return [f"seed_{r['seed']}" for r in report["runs"] if r["status"] in ("done", "reused")]


def check_commands(commands: list[list[str]], tmp_path: Path) -> None:
    cli = [sys.executable, "-m", "trinity_like.cli"]
    for command in commands:
        args = command[1:]
        if args[0] == "report":
            r = subprocess.run(cli + args, cwd=tmp_path, capture_output=True, text=True)
            assert r.returncode == 0, r.stderr
            page = (tmp_path / args[args.index("--out") + 1]).read_text()
            assert "window.REPORT" in page
            if "compare" in args[1]:
                assert '"compares":[{"name":"compare_add2"' in page
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
            assert [Path(r["path"]).name for r in runs] == [n for a in args[1:] for n in shown_runs(tmp_path / a)]
            compares = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{port}/api/compares").read())
            assert [c["name"] for c in compares] == [Path(a).name for a in args[1:] if "compare" in a]
        finally:
            proc.terminate()
            proc.wait(timeout=10)
