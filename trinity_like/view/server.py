"""``trinity-like view RUN_DIR [RUN_DIR ...]``: the local web page over one or more runs.

FastAPI + uvicorn, both installed already (verl imports them): a few JSON routes over
:class:`~trinity_like.view.run.Run` and the page's static files, which ship in the
package (``view/static``: no CDN, no internet). Bound to 127.0.0.1 only.

Routes (``i``: the run's index on the command line)::

    GET /                              the page
    GET /api/runs                      name, path and what each run has
    GET /api/runs/{i}/metrics?offset=&explorer_offset=   metrics.jsonl rows (and an explorer
                                       process's, split mode) from byte offsets (the page polls it),
                                       with the run's warnings (damaged lines skipped)
    GET /api/runs/{i}/versions         model versions in the buffer (a DPO / RM run: training steps), with row counts
    GET /api/runs/{i}/rollouts?version=&page=&...filters   one page of one step (rollouts.step_page)
    GET /api/runs/{i}/evals            every held-out answer / pair of every evaluation
    GET /api/compares                  each comparison folder's entries, verdict lines and mean curves with
                                       their 95 % bands (view.compare; its runs are among /api/runs)

What it answers to anything else:

- a request whose ``Host`` is not this server's loopback address and port
  (``127.0.0.1:PORT``, ``localhost:PORT``, ``[::1]:PORT``): 421, so a web page that rebinds
  its own name to 127.0.0.1 (DNS rebinding) cannot read the runs back;
- a query parameter out of its range or of the wrong kind: 400 with a one-line message;
- a buffer SQLite cannot read (damaged, locked, not a buffer): 503 with a one-line
  message naming the file; the curves and held-out answers keep working;
- anything unforeseen: 500 with a one-line message (and one line on stderr), never a traceback.
"""

from __future__ import annotations

import json
import socket
import sys
from pathlib import Path
from typing import Any

from trinity_like.errors import TrinityError
from trinity_like.monitor.jsonl import finite
from trinity_like.view.compare import Comparison, comparisons_data, open_folders
from trinity_like.view.rollouts import step_page
from trinity_like.view.run import BufferUnreadable, Filters, Run, setting

STATIC = Path(__file__).parent / "static"
INT64 = 2**63 - 1  # largest byte offset / model version a file or SQLite can hold
METRICS_CHUNK = 16 * 2**20  # bytes of a metrics file one poll reads at most (the next poll reads on)


def run_summary(i: int, run: Run) -> dict[str, Any]:
    buffer = run.buffer()
    return {
        "id": i,
        "name": run.name,
        "path": str(run.path),
        "algorithm": setting(run.config, "algorithm", "type"),
        "buffer": str(buffer.path) if buffer else None,
        "buffer_missing": run.buffer_missing(),
        "warnings": run.warnings,
    }


def _json_body(status: int, detail: str) -> tuple[dict[str, Any], bytes]:
    body = json.dumps({"detail": detail}).encode()  # ASCII: any text is safe here
    start = {
        "type": "http.response.start",
        "status": status,
        "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
    }
    return start, body


class LoopbackOnly:
    """ASGI middleware: only ``Host`` values naming this server's loopback port are served (421
    otherwise), and an exception no route handled is a one-line JSON 500, not a traceback."""

    def __init__(self, app: Any, port: int | None) -> None:
        self.app = app
        self.allowed = None if port is None else {f"{h}:{port}".encode() for h in ("127.0.0.1", "localhost", "[::1]")}

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        hosts = [v.lower() for k, v in scope.get("headers", []) if k == b"host"]
        if self.allowed is not None and (len(hosts) != 1 or hosts[0] not in self.allowed):
            shown = hosts[0].decode("latin-1")[:100] if hosts else "none"
            start, body = _json_body(421, f"Host {shown!r} is not this server's (use http://127.0.0.1:PORT/)")
            await send(start)
            await send({"type": "http.response.body", "body": body})
            return
        started = False

        async def tracked(message: dict[str, Any]) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, tracked)
        except Exception as exc:  # noqa: BLE001 -- the server must stay up; the request gets a one-line 500
            what = f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}"
            sys.stderr.write(f"trinity-like view: error on {scope.get('method')} {scope.get('path')}: {what}\n")
            if not started:
                start, body = _json_body(500, f"internal error: {what}")
                await send(start)
                await send({"type": "http.response.body", "body": body})


def build_app(runs: list[Run], port: int | None = None, comparisons: list[Comparison] | None = None) -> Any:
    """The app over ``runs`` (and ``comparisons``, whose runs are among them); ``port``: the one it is served on
    (other ``Host`` values get 421; None: no check)."""
    from fastapi import FastAPI, HTTPException, Query, Request
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import FileResponse, JSONResponse
    from fastapi.staticfiles import StaticFiles

    class CleanJSON(JSONResponse):
        """Strict ASCII JSON: a NaN or an infinity (a damaged buffer's floats) goes out as null, a lone
        surrogate (text cut mid-character) as its escape."""

        def render(self, content: Any) -> bytes:
            return json.dumps(finite(content), allow_nan=False, separators=(",", ":")).encode()

    app = FastAPI(
        title="trinity-like view", docs_url=None, redoc_url=None, openapi_url=None, default_response_class=CleanJSON
    )
    app.mount("/static", StaticFiles(directory=STATIC), name="static")

    @app.exception_handler(RequestValidationError)
    async def bad_query(_: Request, exc: RequestValidationError) -> JSONResponse:
        errors = [
            f"{'.'.join(str(p) for p in e.get('loc', ())[1:]) or 'request'}: {e.get('msg', 'invalid')}"
            for e in exc.errors()
        ]
        return CleanJSON({"detail": "; ".join(errors)[:500]}, status_code=400)

    @app.exception_handler(BufferUnreadable)
    async def unreadable(_: Request, exc: BufferUnreadable) -> JSONResponse:
        return CleanJSON({"detail": str(exc)}, status_code=503)

    def get(i: int) -> Run:
        if not 0 <= i < len(runs):
            raise HTTPException(404, f"no run {i} (there are {len(runs)})")
        return runs[i]

    @app.get("/")
    def index() -> FileResponse:
        return FileResponse(STATIC / "index.html")

    @app.get("/api/runs")
    def list_runs() -> list[dict[str, Any]]:
        return [run_summary(i, r) for i, r in enumerate(runs)]

    @app.get("/api/compares")
    def list_comparisons() -> list[dict[str, Any]]:
        return comparisons_data(runs, comparisons or [])

    @app.get("/api/runs/{i}/metrics")
    def metrics(
        i: int, offset: int = Query(0, ge=0, le=INT64), explorer_offset: int = Query(0, ge=0, le=INT64)
    ) -> dict[str, Any]:
        run = get(i)
        rows, end, explorer_end = run.metrics(offset, explorer_offset, max_bytes=METRICS_CHUNK)
        return {"rows": rows, "offset": end, "explorer_offset": explorer_end, "warnings": run.warnings}

    @app.get("/api/runs/{i}/versions")
    def versions(i: int) -> list[dict[str, int]]:
        return get(i).steps()

    @app.get("/api/runs/{i}/rollouts")
    def rollouts(
        i: int,
        version: int = Query(ge=0, le=INT64),
        page: int = Query(0, ge=0, le=2**31),
        page_size: int = Query(32, ge=1, le=500),
        reward_min: float | None = Query(None, allow_inf_nan=False),
        reward_max: float | None = Query(None, allow_inf_nan=False),
        length_min: int | None = Query(None, ge=0, le=2**31),
        length_max: int | None = Query(None, ge=0, le=2**31),
        finish_reason: str | None = Query(None, max_length=64),
        text: str | None = Query(None, max_length=1000),
    ) -> dict[str, Any]:
        filters = Filters(reward_min, reward_max, length_min, length_max, finish_reason or None, text or None)
        return step_page(get(i), version, filters, page, page_size)

    @app.get("/api/runs/{i}/evals")
    def evals(i: int) -> list[dict[str, Any]]:
        return get(i).evals()

    return LoopbackOnly(app, port)


def listen(port: int) -> socket.socket:
    """A socket bound to 127.0.0.1:``port``; a bad or busy port is a one-line :class:`TrinityError`."""
    if not 1 <= port <= 65535:
        raise TrinityError(f"--port {port}: a TCP port is 1..65535")
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.bind(("127.0.0.1", port))
        sock.listen(128)
    except OSError as exc:
        sock.close()
        raise TrinityError(f"--port {port}: cannot listen on 127.0.0.1:{port} ({exc.strerror}); pick another") from None
    return sock


def serve(run_dirs: list[str], port: int) -> None:
    """Open the runs and comparison folders (a folder that is neither is a one-line error) and serve until Ctrl-C."""
    import uvicorn

    runs, comparisons = open_folders(run_dirs)
    for run in runs:
        try:
            has_rows = bool(run.steps())
        except BufferUnreadable as exc:  # the curves still show; the rollouts tab says why not
            print(f"trinity-like view: {exc}; rollouts of this run cannot be shown", file=sys.stderr)
            has_rows = True
        if not run.metrics()[0] and not has_rows:
            print(f"{run.path}: nothing recorded yet (no metrics, no buffer); the page fills in as the run writes")
    sock = listen(port)
    print(
        f"trinity-like view: http://127.0.0.1:{port}/  ({len(runs)} run{'s' * (len(runs) != 1)}"
        + (f", {len(comparisons)} comparison{'s' * (len(comparisons) != 1)}" if comparisons else "")
        + "; Ctrl-C stops)",
        flush=True,
    )
    config = uvicorn.Config(
        build_app(runs, port, comparisons),
        log_level="warning",
        access_log=False,
        timeout_graceful_shutdown=1,
        lifespan="off",
    )
    with sock:
        uvicorn.Server(config).run(sockets=[sock])
