"""Hostile run folders and requests against `trinity-like view` / `report`, as a user (or a web page) meets them.

Each server case starts the real server (`python -m trinity_like.cli view`) on a free port,
sends what an outside probe sent -- damaged metrics / evals lines, a damaged buffer, query
parameters out of range, /openapi.json, a foreign ``Host`` -- and checks the status codes,
that every answer is JSON with a message (never a traceback on stderr), and that the server
still answers afterwards. Command cases run the real CLI and check the exit status, the one
line on stderr and that nothing was written outside the run folder (or the ``--out`` asked for).
"""

from __future__ import annotations

import http.client
import json
import os
import re
import socket
import sqlite3
import subprocess
import sys
import time
from html.parser import HTMLParser
from pathlib import Path

import pytest
from _lib.faultlib import record

from trinity_like.buffer.sqlite_storage import SqliteParams, SqliteStorage
from trinity_like.experience import Experience

CLI = [sys.executable, "-m", "trinity_like.cli"]
HOSTILE = ["<!--<script>", "</script><script>window.pwned=1</script>", "]]>", "\u2028\u2029", "<img src=x onerror=1>"]

# damaged lines of metrics.jsonl: each skipped with one warning naming the file and the line
BAD_METRIC_LINES = {
    "torn": '{"step": 9, "loss": 0.',  # a kill mid-write, with the next run's line glued on
    "not_json": "this is not json",
    "not_an_object": "[1, 2, 3]",
    "step_is_text": '{"step": "three", "loss": 1.0}',
    "step_missing": '{"loss": 1.0}',
    "huge_int": '{"step": 4, "loss": ' + "9" * 5000 + "}",
    "deep": "[" * 100_000 + "]" * 100_000,
    "not_utf8": b'{"step": 5, "x": "\xff"}',
}
GOOD_ROWS = [
    {"step": 1, "loss": 1.0, "reward/mean": 0.25},
    {"step": 2, "loss": None, "reward/mean": 0.5},
    {"step": 3, "loss": 0.5, "reward/mean": 0.75},
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def metrics_bytes() -> bytes:
    """The three good rows with every damaged line between them; NaN / Infinity / 1e999 read as null."""
    lines = [json.dumps(GOOD_ROWS[0]).encode()]
    lines += [v if isinstance(v, bytes) else v.encode() for v in BAD_METRIC_LINES.values()]
    lines += [
        b'{"step": 2, "loss": NaN, "reward/mean": 0.5, "kl": Infinity, "x": 1e999}',
        json.dumps(GOOD_ROWS[2]).encode(),
    ]
    return b"\n".join(lines) + b"\n"


def experiences(version: int) -> list[Experience]:
    return [
        Experience(
            tokens=[5, 6, 7, 8 + j],
            prompt_length=2,
            logprobs=[-0.5, -0.25],
            reward=float(j % 2),
            group_id=f"g{version}",
            task_id="t",
            model_version=version,
            finish_reason="stop",
        )
        for j in range(4)
    ]


def make_run(path: Path) -> Path:
    """A run folder as a run writes it: config, metrics (with damaged lines), held-out answers, a buffer."""
    path.mkdir(parents=True)
    config = {"name": "hostile", "model": {"path": "tiny-random"}, "buffer": {"experience": {"storage": "sqlite"}}}
    (path / "config.json").write_text(json.dumps(config))
    (path / "metrics.jsonl").write_bytes(metrics_bytes())
    answers = [
        {"step": 0, "kind": "answer", "task_id": f"t{i}", "prompt": text, "answer": text, "response": text, "reward": 0}
        for i, text in enumerate(HOSTILE)
    ]
    (path / "evals.jsonl").write_text(
        "".join(json.dumps(a) + "\n" for a in answers) + '{"step": 0, "kind": "pair"}\n' + "not json\n"
    )
    with SqliteStorage(params=SqliteParams(), run_dir=path) as buf:
        buf.put(experiences(0) + experiences(1))
    return path


class Server:
    """`trinity-like view` in a child process on a free port."""

    def __init__(self, *run_dirs: Path) -> None:
        self.port = free_port()
        self.proc = subprocess.Popen(
            [*CLI, "view", *map(str, run_dirs), "--port", str(self.port)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        deadline = time.monotonic() + 60
        while socket.socket().connect_ex(("127.0.0.1", self.port)) != 0:
            assert self.proc.poll() is None, self.proc.communicate()
            assert time.monotonic() < deadline, "the server did not start"
            time.sleep(0.1)

    def get(self, path: str, host: str | None = None) -> tuple[int, object]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        conn.putrequest("GET", path, skip_host=host is not None)
        if host is not None:
            conn.putheader("Host", host)
        conn.endheaders()
        r = conn.getresponse()
        body = r.read()
        conn.close()
        return r.status, json.loads(body) if r.getheader("content-type", "").startswith("application/json") else body

    def stop(self) -> str:
        """Stop it; its stderr (which must hold no traceback)."""
        self.proc.terminate()
        _, err = self.proc.communicate(timeout=30)
        assert "Traceback" not in err, err
        return err


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    return make_run(tmp_path / "hostile")


def test_damaged_lines_are_skipped_with_one_warning_each(run_dir: Path, record_property) -> None:
    server = Server(run_dir)
    try:
        for _ in range(3):  # the page polls: a line is named once, not at every poll
            status, got = server.get("/api/runs/0/metrics")
            assert status == 200
        assert [r["step"] for r in got["rows"]] == [1, 2, 3]
        assert got["rows"][1]["loss"] is None and got["rows"][1]["kl"] is None and got["rows"][1]["x"] is None
        status, evals = server.get("/api/runs/0/evals")
        assert status == 200 and [e["prompt"] for e in evals] == HOSTILE  # damaged items skipped, text as written
        status, runs = server.get("/api/runs")
        shown = runs[0]["warnings"]
    finally:
        err = server.stop()
    name = str(run_dir / "metrics.jsonl")
    expected = [f"{name}:{n}:" for n in range(2, 2 + len(BAD_METRIC_LINES))]
    warned = [line for line in err.splitlines() if line.startswith("trinity-like: warning: ")]
    for prefix in expected:
        assert sum(prefix in line for line in warned) == 1, (prefix, err)  # once each, on stderr
        assert sum(m.startswith(prefix) for m in shown) == 1, (prefix, shown)  # and for the page
    assert sum(f"{run_dir / 'evals.jsonl'}:" in line for line in warned) == 2
    record(
        record_property,
        f"damaged lines in metrics.jsonl / evals.jsonl ({', '.join(BAD_METRIC_LINES).replace('_', ' ')}, NaN / Infinity / 1e999, "
        "an item of the wrong shape), served by `trinity-like view`",
        f"each of the {len(BAD_METRIC_LINES) + 2} damaged lines skipped with one warning naming file and line "
        "(stderr and the page); NaN / infinities read as null; the other rows served",
        "-",
        "-",
    )


def damage(run: Path, how: str) -> None:
    db = run / "buffer.sqlite"
    if how == "truncated":
        db.write_bytes(db.read_bytes()[: db.stat().st_size // 3])
    elif how == "garbage":
        db.write_bytes(os.urandom(8192))
    elif how == "empty_file":
        db.write_bytes(b"")
    elif how in ("table_missing", "wrong_types"):
        con = sqlite3.connect(db)
        if how == "table_missing":
            con.execute("DROP TABLE state")
        else:  # every kind of wrong value a hand edit or a foreign file can hold
            con.execute("UPDATE rows SET header = 'not json' WHERE seq = 1")
            con.execute("UPDATE rows SET arrays = 'text, not a blob' WHERE seq = 2")
            con.execute('UPDATE rows SET header = \'{"_arrays": {"tokens": 4}, "prompt_length": "x"}\' WHERE seq = 3')
            con.execute("UPDATE rows SET kind = 42 WHERE seq = 5")
            con.execute("UPDATE rows SET arrays = randomblob(length(arrays)) WHERE seq = 6")
            con.execute("UPDATE state SET status = 'broken' WHERE seq = 7")
            con.execute("UPDATE state SET model_version = 'v1' WHERE seq = 8")
        con.commit()
        con.close()


BUFFER_CASES = {  # case -> the status of /versions and /rollouts
    "truncated": 503,
    "garbage": 503,
    "empty_file": 503,
    "table_missing": 503,
    "wrong_types": 200,  # the rows that decode are shown; the others are named in the page's notes
    "locked": 503,
}


def check_damaged_buffer(run_dir: Path, how: str) -> None:
    """One damaged buffer behind a real server: the status of its routes, and the rest of the page served."""
    holder = None
    if how == "locked":  # another process holds the database in exclusive mode
        holder = sqlite3.connect(run_dir / "buffer.sqlite")
        holder.execute("PRAGMA locking_mode=EXCLUSIVE")
        holder.execute("BEGIN EXCLUSIVE")
    else:
        damage(run_dir, how)
    server = Server(run_dir)
    try:
        for path in ("/api/runs/0/versions", "/api/runs/0/rollouts?version=0", "/api/runs/0/rollouts?version=1"):
            status, got = server.get(path)
            assert status == BUFFER_CASES[how], (how, path, status, got)
            if status == 503:
                assert str(run_dir / "buffer.sqlite") in got["detail"] and "\n" not in got["detail"], (how, got)
        if how == "wrong_types":
            _, page = server.get("/api/runs/0/rollouts?version=0")
            assert len([s for g in page["groups"] for s in g["samples"]]) < 4 and "damaged rows" in page["notes"][0]
        for path in ("/api/runs/0/metrics", "/api/runs/0/evals", "/", "/api/runs"):  # the curves; still up
            assert server.get(path)[0] == 200, (how, path)
    finally:
        server.stop()
        if holder is not None:
            holder.close()


def test_a_damaged_buffer_is_a_clear_answer_and_the_curves_still_work(tmp_path: Path, record_property) -> None:
    for how in BUFFER_CASES:
        check_damaged_buffer(make_run(tmp_path / how), how)
    record(
        record_property,
        f"damaged buffer.sqlite behind `trinity-like view` ({', '.join(BUFFER_CASES).replace('_', ' ')})",
        "503 with one line naming the file (wrong types: the rows that decode shown, the others named in the "
        f"page's notes); the curves and held-out answers still served: {len(BUFFER_CASES)}/{len(BUFFER_CASES)}",
        "-",
        "-",
    )


BAD_QUERIES = [
    "/api/runs/0/metrics?offset=18446744073709551616",  # beyond 2^63
    "/api/runs/0/metrics?offset=9223372036854775808",
    "/api/runs/0/metrics?offset=-1",
    "/api/runs/0/metrics?offset=1.5",
    "/api/runs/0/metrics?explorer_offset=1e400",
    "/api/runs/0/rollouts?version=18446744073709551616",
    "/api/runs/0/rollouts?version=-1",
    "/api/runs/0/rollouts",  # version missing
    "/api/runs/0/rollouts?version=0&page=99999999999999999999",
    "/api/runs/0/rollouts?version=0&page=-3",
    "/api/runs/0/rollouts?version=0&page_size=1000000",
    "/api/runs/0/rollouts?version=0&page_size=0",
    "/api/runs/0/rollouts?version=0&reward_min=nan",
    "/api/runs/0/rollouts?version=0&reward_max=inf",
    "/api/runs/0/rollouts?version=0&length_min=-5",
    "/api/runs/0/rollouts?version=0&length_max=99999999999999999999",
    "/api/runs/0/rollouts?version=0&text=" + "x" * 5000,
    "/api/runs/x/metrics",
]


def test_bad_queries_are_400_with_a_message_and_the_server_stays_up(run_dir: Path, record_property) -> None:
    server = Server(run_dir)
    try:
        for path in BAD_QUERIES:
            status, got = server.get(path)
            assert status == 400 and isinstance(got, dict) and got["detail"], (path, status, got)
        assert server.get("/api/runs/999999999999999999999999/metrics")[0] == 404
        status, got = server.get("/api/runs/0/metrics?offset=9223372036854775807")  # the largest: nothing there
        assert status == 200 and (got["rows"], got["offset"]) == ([], 2**63 - 1)
        status, _ = server.get("/openapi.json")
        assert status == 404
        assert server.get("/api/runs/0/rollouts?version=0&page=5")[0] == 200  # past the last page: an empty page
        assert server.get("/api/runs")[0] == 200
    finally:
        server.stop()
    record(
        record_property,
        f"{len(BAD_QUERIES)} bad query parameters (offsets at and beyond 2^63, negative, non-integer, NaN, "
        "huge page sizes and pages) and /openapi.json against `trinity-like view`",
        f"400 with a message: {len(BAD_QUERIES)}/{len(BAD_QUERIES)}; /openapi.json 404; the server still answers",
        "-",
        "-",
    )


def test_only_the_loopback_host_is_served(run_dir: Path, record_property) -> None:
    server = Server(run_dir)
    port = server.port
    try:
        for host in (
            "evil.example",
            f"evil.example:{port}",
            "127.0.0.1",
            f"127.0.0.1:{port + 1}",
            f"localhost.evil:{port}",
        ):
            status, got = server.get("/api/runs", host=host)
            assert status == 421 and "not this server's" in got["detail"], (host, status, got)
            assert server.get("/", host=host)[0] == 421
        for host in (f"127.0.0.1:{port}", f"localhost:{port}", f"LOCALHOST:{port}", f"[::1]:{port}"):
            assert server.get("/api/runs", host=host)[0] == 200, host
    finally:
        server.stop()
    record(
        record_property,
        "foreign Host header (DNS rebinding: Host: evil.example) against `trinity-like view`",
        "421 for every Host but 127.0.0.1 / localhost / [::1] at the server's port",
        "-",
        "-",
    )


def cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, cwd=cwd, timeout=120)


def one_line(out: subprocess.CompletedProcess, pattern: str) -> None:
    lines = out.stderr.splitlines()
    assert out.returncode == 2 and len(lines) == 1, out.stderr[-2000:]
    assert re.fullmatch("trinity-like: error: " + pattern, lines[0]), lines[0]


def tree(path: Path) -> dict[str, int]:
    return {str(p.relative_to(path)): p.stat().st_size for p in sorted(path.rglob("*")) if p.is_file()}


def test_bad_ports_are_one_line_and_exit_2(run_dir: Path, record_property) -> None:
    cases = {
        "70000": r"argument --port: 70000 is not a TCP port \(1\.\.65535\) \(see --help\)",
        "0": r"argument --port: 0 is not a TCP port \(1\.\.65535\) \(see --help\)",
        "-1": r"argument --port: -1 is not a TCP port \(1\.\.65535\) \(see --help\)",
        "http": r"argument --port: not a port number: 'http' \(see --help\)",
    }
    before = tree(run_dir.parent)
    for port, pattern in cases.items():
        one_line(cli("view", str(run_dir), f"--port={port}", cwd=run_dir.parent), pattern)
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        out = cli("view", str(run_dir), "--port", str(port), cwd=run_dir.parent)
    assert out.returncode == 2 and out.stderr.splitlines()[-1] == (
        f"trinity-like: error: --port {port}: cannot listen on 127.0.0.1:{port} (Address already in use); pick another"
    )
    assert "Traceback" not in out.stderr
    assert tree(run_dir.parent) == before
    record(
        record_property,
        "`trinity-like view --port` 70000 / 0 / -1 / text / a port in use",
        "one-line error, exit 2: 5/5",
        "-",
        "-",
    )


class Scripts(HTMLParser):
    """The text of each <script> element, as an HTML parser splits the page (the browser's rules)."""

    def __init__(self) -> None:
        super().__init__()
        self.scripts: list[str] = []
        self._open = False

    def handle_starttag(self, tag: str, attrs: list) -> None:
        if tag == "script":
            self._open = True
            self.scripts.append("")

    def handle_endtag(self, tag: str) -> None:
        if tag == "script":
            self._open = False

    def handle_data(self, data: str) -> None:
        if self._open:
            self.scripts[-1] += data


def test_report_embeds_hostile_text_as_data_only(run_dir: Path, record_property) -> None:
    """Model text with `<!--<script>`, `</script>`, `]]>`, U+2028: the report's data script ends where it
    should and reads back as the same text (the browser check: tests/view/test_browser.py)."""
    out = run_dir.parent / "report.html"
    before = tree(run_dir)
    done = cli("report", str(run_dir), "--out", str(out), cwd=run_dir.parent)
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr and "metrics.jsonl:2:" in done.stderr  # damaged lines named
    html = out.read_text()
    for text in HOSTILE:
        assert text not in html  # only as escapes
    parser = Scripts()
    parser.feed(html)
    assert len(parser.scripts) == 4  # the data, uPlot, the page's own, its comparison charts
    data = parser.scripts[0]
    assert data.startswith("window.REPORT = ") and data.endswith(";")
    report = json.loads(data[len("window.REPORT = ") : -1])
    assert [e["response"] for e in report["evals"][0]] == HOSTILE
    assert [r["step"] for r in report["metrics"][0]] == [1, 2, 3]
    assert any(w.startswith(f"{run_dir / 'metrics.jsonl'}:2:") for w in report["runs"][0]["warnings"])
    assert tree(run_dir) == before  # the run folder is only read
    record(
        record_property,
        "model text `<!--<script>`, `</script><script>...`, `]]>`, U+2028 in a run, through `trinity-like report`",
        "escaped for a JSON-in-script context: the page's scripts split where they should and the data reads back "
        "as written; in Chromium the page renders and no script from the data runs (tests/view/test_browser.py)",
        "-",
        "-",
    )


def test_report_and_plot_out_paths_are_checked_before_writing(run_dir: Path) -> None:
    work = run_dir.parent
    (work / "a_folder").mkdir()
    os.mkfifo(work / "a_fifo.html")
    before = tree(work)
    one_line(
        cli("report", str(run_dir), "--out", str(work / "a_folder"), cwd=work), r"--out .*a_folder: is a folder; .*"
    )
    one_line(
        cli("report", str(run_dir), "--out", str(work / "a_fifo.html"), cwd=work),
        r"--out .*: exists and is not a regular file",
    )
    one_line(cli("report", str(run_dir), "--out", str(work / "no/such/r.html"), cwd=work), r"--out .*: no folder .*")
    one_line(
        cli("plot", str(run_dir), "--out", str(work / "p.txt"), cwd=work), r"--out .*p\.txt: not an image format .*"
    )
    one_line(cli("plot", "--timeline", str(run_dir), cwd=work), r".*hostile: no timeline\.jsonl \(.*\)")
    assert tree(work) == before
