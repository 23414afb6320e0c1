"""``trinity-like view RUN_DIR [RUN_DIR ...]``: the local web page over one or more runs.

FastAPI + uvicorn, both installed already (verl imports them): a few JSON routes over
:class:`~trinity_like.view.run.Run` and the page's static files, which ship in the
package (``view/static``: no CDN, no internet). Bound to 127.0.0.1 only.

Routes (``i``: the run's index on the command line)::

    GET /                              the page
    GET /api/runs                      name, path and what each run has
    GET /api/runs/{i}/metrics?offset=&explorer_offset=   metrics.jsonl rows (and an explorer
                                       process's, split mode) from byte offsets (the page polls it)
    GET /api/runs/{i}/versions         model versions in the buffer (a DPO / RM run: training steps), with row counts
    GET /api/runs/{i}/rollouts?version=&page=&...filters   one page of one step (rollouts.step_page)
    GET /api/runs/{i}/evals            every held-out answer / pair of every evaluation
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trinity_like.view.rollouts import step_page
from trinity_like.view.run import Filters, Run

STATIC = Path(__file__).parent / "static"


def run_summary(i: int, run: Run) -> dict[str, Any]:
    buffer = run.buffer()
    return {
        "id": i,
        "name": run.name,
        "path": str(run.path),
        "algorithm": run.config.get("algorithm", {}).get("type"),
        "buffer": str(buffer.path) if buffer else None,
        "buffer_missing": run.buffer_missing(),
    }


def build_app(runs: list[Run]) -> Any:
    from fastapi import FastAPI, HTTPException, Query
    from fastapi.responses import FileResponse
    from fastapi.staticfiles import StaticFiles

    app = FastAPI(title="trinity-like view", docs_url=None, redoc_url=None)
    app.mount("/static", StaticFiles(directory=STATIC), name="static")

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

    @app.get("/api/runs/{i}/metrics")
    def metrics(i: int, offset: int = Query(0, ge=0), explorer_offset: int = Query(0, ge=0)) -> dict[str, Any]:
        rows, end, explorer_end = get(i).metrics(offset, explorer_offset)
        return {"rows": rows, "offset": end, "explorer_offset": explorer_end}

    @app.get("/api/runs/{i}/versions")
    def versions(i: int) -> list[dict[str, int]]:
        return get(i).steps()

    @app.get("/api/runs/{i}/rollouts")
    def rollouts(
        i: int,
        version: int,
        page: int = Query(0, ge=0),
        page_size: int = Query(32, ge=1, le=500),
        reward_min: float | None = None,
        reward_max: float | None = None,
        length_min: int | None = None,
        length_max: int | None = None,
        finish_reason: str | None = None,
        text: str | None = None,
    ) -> dict[str, Any]:
        filters = Filters(reward_min, reward_max, length_min, length_max, finish_reason or None, text or None)
        return step_page(get(i), version, filters, page, page_size)

    @app.get("/api/runs/{i}/evals")
    def evals(i: int) -> list[dict[str, Any]]:
        return get(i).evals()

    return app


def serve(run_dirs: list[str], port: int) -> None:
    """Open the runs (a folder that is not a run is a one-line error) and serve until Ctrl-C."""
    import socket

    import uvicorn

    runs = [Run.open(d) for d in run_dirs]
    for run in runs:
        rows, _, _ = run.metrics()
        if not rows and not run.steps():
            print(f"{run.path}: nothing recorded yet (no metrics, no buffer); the page fills in as the run writes")
    with socket.socket() as probe:  # a busy port is the user's to change: one line, not a traceback
        if probe.connect_ex(("127.0.0.1", port)) == 0:
            from trinity_like.errors import TrinityError

            raise TrinityError(f"port {port} on 127.0.0.1 is in use; pick another with --port")
    print(
        f"trinity-like view: http://127.0.0.1:{port}/  ({len(runs)} run{'s' * (len(runs) != 1)}; Ctrl-C stops)",
        flush=True,
    )
    uvicorn.run(build_app(runs), host="127.0.0.1", port=port, log_level="warning", timeout_graceful_shutdown=1)
