"""A ``trinity-like serve`` process on a tiny model, started the way a user starts it (the CLI)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from trinity_like.models.tiny import build_tiny_model

os.environ.setdefault("TINKER_TELEMETRY", "0")  # the SDK's usage reports: nothing to send them to

LOCAL_KEY = "tml-local"  # what a local user sets: the SDK insists on a "tml-" key


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def running_server(data_dir: Path, *args: str, port: int | None = None, key: str | None = None):
    """``trinity-like serve`` on 127.0.0.1; yields its base URL; stopped with SIGINT (Ctrl-C)."""
    port = port or free_port()
    cmd = [sys.executable, "-m", "trinity_like.cli", "serve", "--port", str(port), "--data-dir", str(data_dir), *args]
    log = open(data_dir.parent / f"server-{port}.log", "w")  # noqa: SIM115 -- closed below
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"server exited {proc.returncode}: {Path(log.name).read_text()[-2000:]}")
            try:
                if httpx.get(f"{url}/api/v1/healthz", headers={"X-API-Key": key or LOCAL_KEY}).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("server did not start in 120 s")
            time.sleep(0.3)
        yield url
    finally:
        proc.send_signal(2)  # SIGINT, as Ctrl-C
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> str:
    return str(build_tiny_model(tmp_path_factory.mktemp("serve-tiny") / "model", seed=7))


@pytest.fixture(scope="session")
def server(tmp_path_factory, tiny_model):
    """(base URL, data directory) of a server on the tiny model."""
    os.environ["TINKER_API_KEY"] = LOCAL_KEY
    data_dir = tmp_path_factory.mktemp("serve") / "data"
    with running_server(data_dir, "--model", tiny_model) as url:
        yield url, data_dir
