"""The HTTP routes of ``trinity-like serve``: Tinker's ``/api/v1`` as the ``tinker`` SDK 0.38 calls it.

Bodies are the SDK's own ``tinker.types`` models as JSON, except ``forward_backward``
(protobuf in) and the ``ForwardBackwardOutput`` / ``SampleResponse`` results (protobuf
out when asked for, as the SDK does; JSON otherwise, :mod:`.wire`). Mutating calls answer
``UntypedAPIFuture`` at once; ``retrieve_future`` waits up to ``poll_seconds`` for the
result, then answers ``try_again`` so the SDK polls again. ``BODIES`` names each POST
route's body; ``GET /api/v1/openapi.json`` describes them all (:mod:`.openapi`).

Before any route runs, :mod:`.guard` refuses what a web page could send (421 a foreign
Host, 403 a cross-site request, 415 a body of another content type) and checks the key.
Status codes follow the SDK's retry rules: 400 a user error (shown, not retried), 401 a
wrong API key, 404 an unknown id, 413 a body over ``max_body_bytes``, 429 a full queue and
503 a server shutting down (both retried by the SDK). A request that fails while running
is reported by ``retrieve_future`` as ``{"error", "category": "user" | "server"}``. No JSON
answer holds a NaN or infinite number: those travel as the strings ``"NaN"``,
``"Infinity"``, ``"-Infinity"``, which the SDK's models read back as floats.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import AsyncIterator
from concurrent.futures import Future
from typing import Any

from fastapi import FastAPI, Query, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ValidationError
from tinker import types

from trinity_like.client.serve.backend import USER_ERRORS, Backend, Busy, Closing, NotFound
from trinity_like.client.serve.guard import check_request, own_hosts
from trinity_like.client.serve.openapi import PROTOBUF, openapi_spec
from trinity_like.client.serve.wire import ENCODERS, decode_forward_backward, encode_result, json_result

STATUS = {NotFound: 404, Busy: 429, Closing: 503, ValidationError: 400, **dict.fromkeys(USER_ERRORS, 400)}
BODIES: dict[str, Any] = {  # what each POST route reads: a tinker.types model (JSON), protobuf, or nothing
    "/api/v1/client/config": types.ClientConfigRequest,
    "/api/v1/client/dynamic_config": types.ClientConfigRequest,
    "/api/v1/create_session": types.CreateSessionRequest,
    "/api/v1/session_heartbeat": types.SessionHeartbeatRequest,
    "/api/v1/sessions/{session_id}/finish": None,
    "/api/v1/telemetry": types.TelemetrySendRequest,
    "/api/v1/create_model": types.CreateModelRequest,
    "/api/v1/get_info": types.GetInfoRequest,
    "/api/v1/forward_backward": PROTOBUF,
    "/api/v1/optim_step": types.OptimStepRequest,
    "/api/v1/save_weights": types.SaveWeightsRequest,
    "/api/v1/load_weights": types.LoadWeightsRequest,
    "/api/v1/save_weights_for_sampler": types.SaveWeightsForSamplerRequest,
    "/api/v1/create_sampling_session": types.CreateSamplingSessionRequest,
    "/api/v1/asample": types.SampleRequest,
    "/api/v1/retrieve_future": types.FutureRetrieveRequest,
}


def client_config(backend: Backend) -> types.ClientConfigResponse:
    """What this server tells the SDK about itself (``/api/v1/client/config``): plain API keys,
    httpx, one forward_backward chunk at a time of at most ``max_batch_datums`` datums,
    uncompressed bodies, client-side custom losses."""
    return types.ClientConfigResponse(
        pjwt_auth_enabled=False,
        use_pyqwest_transport=False,
        parallel_fwdbwd_chunks=False,
        proto_compress_fwdbwd=False,
        sample_use_retrieve_futures=False,
        custom_loss_server_side=False,
        sample_join_sampling_session=False,
        fwdbwd_max_chunk_len=backend.params.max_batch_datums,
    )


def json_safe(value: Any) -> Any:
    """``value`` with each NaN or infinite float as ``"NaN"`` / ``"Infinity"`` / ``"-Infinity"``."""
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(v) for v in value]
    return value


def _json(model: BaseModel | dict, status: int = 200) -> JSONResponse:
    body = model if isinstance(model, dict) else model.model_dump(mode="json")
    return JSONResponse(json_safe(body), status_code=status)


def describe(exc: BaseException) -> str:
    """One line: a validation error's first problems by field (not the input echoed back), else the message."""
    if isinstance(exc, ValidationError):  # field names may be the caller's: odd ones as a repr, cut short
        part = lambda p: str(p) if isinstance(p, int) or str(p).isidentifier() else repr(p)[:40]  # noqa: E731
        problems = [f"{'.'.join(map(part, e['loc'])) or 'body'}: {e['msg']}" for e in exc.errors()[:3]]
        more = f" (and {exc.error_count() - 3} more)" if exc.error_count() > 3 else ""
        text = f"invalid {exc.title}: {'; '.join(problems)}{more}"
    else:
        text = f"{type(exc).__name__}: {exc}"
    return " ".join(text.split())


async def _body(request: Request, model: type[BaseModel]) -> Any:
    return model.model_validate_json(await request.body())


async def _wait(future: Future, seconds: float) -> bool:
    """Whether ``future`` finished within ``seconds`` (it is never cancelled here)."""
    if future.done():
        return True
    loop = asyncio.get_running_loop()
    event = asyncio.Event()
    future.add_done_callback(lambda _: loop.call_soon_threadsafe(event.set))
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(event.wait(), seconds)
    return future.done()


def build_app(backend: Backend) -> FastAPI:
    params = backend.params

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        yield
        await asyncio.to_thread(backend.close)  # queued training requests finish; saves complete

    app = FastAPI(
        title="trinity-like serve",
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
        openapi_url="/api/v1/openapi.json",
    )

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = openapi_spec(app, BODIES)
        return app.openapi_schema

    app.openapi = openapi

    for kind, status in STATUS.items():  # looked up along the exception's MRO: NotFound before ValueError
        app.add_exception_handler(
            kind, lambda _r, exc, status=status: _json({"error": backend.hide_paths(describe(exc))}, status)
        )

    hosts = own_hosts(params)

    @app.middleware("http")
    async def guard(request: Request, call_next):
        refusal = check_request(request.method, request.url.path, request.headers, params, hosts)
        if refusal is not None:
            return _json({"error": refusal[1]}, refusal[0])
        return await call_next(request)

    # -- the SDK's session plumbing ----------------------------------------------------------
    @app.get("/api/v1/healthz")
    async def healthz():
        return {"status": "ok"}

    @app.post("/api/v1/client/config")
    async def config():
        return _json(client_config(backend))

    @app.post("/api/v1/client/dynamic_config")
    async def dynamic_config():
        return _json(types.ClientDynamicConfigResponse())

    @app.post("/api/v1/create_session")
    async def create_session(request: Request):
        await _body(request, types.CreateSessionRequest)
        return _json(types.CreateSessionResponse(session_id=backend.create_session()))

    @app.post("/api/v1/session_heartbeat")
    async def heartbeat(request: Request):
        backend.check_session((await _body(request, types.SessionHeartbeatRequest)).session_id)
        return _json(types.SessionHeartbeatResponse())

    @app.post("/api/v1/sessions/{session_id}/finish")
    async def finish(session_id: str):
        backend.check_session(session_id)
        return Response(status_code=200)

    @app.post("/api/v1/telemetry")
    async def telemetry():
        return {"status": "accepted"}  # the SDK's usage reports: accepted, not kept

    @app.get("/api/v1/get_server_capabilities")
    async def capabilities():
        return _json(await asyncio.to_thread(backend.capabilities))

    # -- training ------------------------------------------------------------------------------
    @app.post("/api/v1/create_model")
    async def create_model(request: Request):
        return _json(backend.create_model(await _body(request, types.CreateModelRequest)))

    @app.post("/api/v1/get_info")
    async def get_info(request: Request):
        return _json(backend.get_info((await _body(request, types.GetInfoRequest)).model_id))

    @app.post("/api/v1/forward_backward")
    async def forward_backward(request: Request):
        req, forward_only = decode_forward_backward(await request.body())
        return _json(backend.forward_backward(req, forward_only))

    @app.post("/api/v1/optim_step")
    async def optim_step(request: Request):
        return _json(backend.optim_step(await _body(request, types.OptimStepRequest)))

    @app.post("/api/v1/save_weights")
    async def save_weights(request: Request):
        return _json(backend.save_state(await _body(request, types.SaveWeightsRequest)))

    @app.post("/api/v1/load_weights")
    async def load_weights(request: Request):
        return _json(backend.load_state(await _body(request, types.LoadWeightsRequest)))

    @app.post("/api/v1/save_weights_for_sampler")
    async def save_for_sampler(request: Request):
        return _json(backend.save_for_sampler(await _body(request, types.SaveWeightsForSamplerRequest)))

    # -- sampling ------------------------------------------------------------------------------
    @app.post("/api/v1/create_sampling_session")
    async def create_sampling_session(request: Request):
        req = await _body(request, types.CreateSamplingSessionRequest)
        sampler_id = await asyncio.to_thread(backend.create_sampler, req)
        return _json(types.CreateSamplingSessionResponse(sampling_session_id=sampler_id))

    @app.post("/api/v1/asample")
    async def asample(request: Request):
        return _json(backend.sample(await _body(request, types.SampleRequest)))

    @app.get("/api/v1/samplers/{sampler_id}")
    async def get_sampler(sampler_id: str):
        sampler = backend.sampler(sampler_id)
        return _json(
            types.GetSamplerResponse(
                sampler_id=sampler_id, base_model=sampler.base_model, model_path=sampler.model_path
            )
        )

    # -- futures -------------------------------------------------------------------------------
    @app.post("/api/v1/retrieve_future")
    async def retrieve(request: Request):
        req = await _body(request, types.FutureRetrieveRequest)
        future = backend.future(req.request_id)
        if not await _wait(future, params.poll_seconds):
            return _json({"type": "try_again", "request_id": req.request_id, "queue_state": "active"})
        if future.cancelled():
            return _json({"error": "the request was cancelled", "category": "server"})
        if future.exception() is not None:
            return _json(backend.error_body(future.exception()))
        result = future.result()
        if type(result) in ENCODERS:
            if PROTOBUF in request.headers.get("accept", ""):
                return Response(encode_result(result), media_type=PROTOBUF)
            return _json(json_result(result))
        return _json(result)

    # -- checkpoints ---------------------------------------------------------------------------
    @app.get("/api/v1/training_runs")
    async def training_runs(limit: int = Query(20, ge=1, le=1000), offset: int = Query(0, ge=0)):
        runs = backend.store.runs()
        page = [backend.store.training_run(r) for r in runs[offset : offset + limit]]
        return _json(
            types.TrainingRunsResponse(
                training_runs=page, cursor=types.Cursor(offset=offset, limit=limit, total_count=len(runs))
            )
        )

    @app.get("/api/v1/training_runs/{run}")
    async def training_run(run: str):
        return _json(backend.store.training_run(run))

    @app.get("/api/v1/training_runs/{run}/checkpoints")
    async def checkpoints(run: str):
        return _json(types.CheckpointsListResponse(checkpoints=backend.store.checkpoints(run)))

    return app
