"""Helpers of the serve tests: a ``trinity-like serve`` process started the way a user starts it
(the CLI), and the training data both doors get."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import httpx
from tinker import types

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


TEXTS = ["one plus two is three", "the cat sat on the mat today", "seven minus four equals three"]


def sft_data(tok, texts):
    out = []
    for text in texts:
        ids = tok.encode(text)
        out.append(
            types.Datum(
                model_input=types.ModelInput.from_ints(ids[:-1]),
                loss_fn_inputs={"target_tokens": ids[1:], "weights": [1.0] * (len(ids) - 1)},
            )
        )
    return out
