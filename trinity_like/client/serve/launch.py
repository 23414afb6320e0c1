"""Start ``trinity-like serve`` as a child process for the length of a ``with`` block.

For scripts that want a local server of their own (examples/serve/cookbook_rl.py,
benchmarks/client.py): the server is the CLI a user runs, on a free port of 127.0.0.1, and
is stopped the way a user stops it (SIGINT: queued training requests finish first)::

    with local_server(Path("runs/x/serve"), "--model", "/path/to/model") as url:
        service = tinker.ServiceClient(base_url=url)   # the official SDK
"""

from __future__ import annotations

import contextlib
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from trinity_like.errors import TrinityError

STARTED = re.compile(r"trinity-like serve: (http://\S+)")  # the line serve() prints once it has its port


@contextlib.contextmanager
def local_server(data_dir: Path, *args: str, timeout: float = 300.0) -> Iterator[str]:
    """``trinity-like serve --port 0 --data-dir DATA_DIR ARGS...``; yields its base URL once it answers.

    Its output goes to ``DATA_DIR/server.log``. A server that exits or does not answer within
    ``timeout`` seconds is a :class:`TrinityError` quoting the end of that log.
    """
    data_dir.mkdir(parents=True, exist_ok=True)
    log_path = data_dir / "server.log"
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "trinity_like.cli", "serve", "--port", "0", "--data-dir", str(data_dir), *args],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        try:
            yield _wait_until_up(proc, log_path, timeout)
        finally:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _wait_until_up(proc: subprocess.Popen, log_path: Path, timeout: float) -> str:
    import httpx

    deadline = time.monotonic() + timeout
    url = None
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise TrinityError(
                f"trinity-like serve exited with {proc.returncode}: {log_path.read_text()[-2000:].strip()}"
            )
        if url is None:
            found = STARTED.search(log_path.read_text())
            url = found.group(1) if found else None
        if url is not None:
            with contextlib.suppress(httpx.TransportError):
                if httpx.get(f"{url}/api/v1/healthz", timeout=5).status_code == 200:
                    return url
        time.sleep(0.3)
    raise TrinityError(f"trinity-like serve did not answer within {timeout:.0f} s (log: {log_path})")
