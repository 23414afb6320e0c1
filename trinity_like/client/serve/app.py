"""The HTTP routes of ``trinity-like serve``: Tinker's ``/api/v1`` as the ``tinker`` SDK 0.38 calls it.

Bodies are the SDK's own ``tinker.types`` models as JSON, except ``forward_backward``
(protobuf in) and the ``ForwardBackwardOutput`` / ``SampleResponse`` results (protobuf
out, :mod:`.wire`). Mutating calls answer ``UntypedAPIFuture`` at once; ``retrieve_future``
waits up to ``poll_seconds`` for the result, then answers ``try_again`` so the SDK polls again.

Status codes follow the SDK's retry rules: 400 a user error (shown, not retried), 401 a
wrong API key, 404 an unknown id, 413 a body over ``max_body_bytes``, 429 a full queue and
503 a server shutting down (both retried by the SDK). A request that fails while running
is reported by ``retrieve_future`` as ``{"error", "category": "user" | "server"}``.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
from collections.abc import AsyncIterator
from concurrent.futures import Future
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ValidationError
from tinker import types

from trinity_like.client.serve.backend import USER_ERRORS, Backend, Busy, Closing, NotFound, error_body
from trinity_like.client.serve.wire import ENCODERS, PROTO_CONTENT_TYPE, decode_forward_backward, encode_result

# What this server tells the SDK about itself (``/api/v1/client/config``): plain API keys,
# httpx, one forward_backward chunk at a time, uncompressed bodies, client-side custom losses.
CLIENT_CONFIG = types.ClientConfigResponse(
    pjwt_auth_enabled=False,
    use_pyqwest_transport=False,
    parallel_fwdbwd_chunks=False,
    proto_compress_fwdbwd=False,
    sample_use_retrieve_futures=False,
    custom_loss_server_side=False,
    sample_join_sampling_session=False,
)
STATUS = {NotFound: 404, Busy: 429, Closing: 503, ValidationError: 400, **dict.fromkeys(USER_ERRORS, 400)}


def _json(model: BaseModel | dict, status: int = 200) -> JSONResponse:
    body = model if isinstance(model, dict) else model.model_dump(mode="json")
    return JSONResponse(body, status_code=status)


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

    app = FastAPI(title="trinity-like serve", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)

    for kind, status in STATUS.items():  # looked up along the exception's MRO: NotFound before ValueError
        app.add_exception_handler(
            kind, lambda _r, exc, status=status: _json({"error": f"{type(exc).__name__}: {exc}"}, status)
        )

    @app.middleware("http")
    async def guard(request: Request, call_next):
        if params.api_key is not None and not hmac.compare_digest(
            request.headers.get("x-api-key", "").encode(), params.api_key.encode()
        ):
            return _json({"error": "missing or wrong API key (X-API-Key; the SDK's api_key / TINKER_API_KEY)"}, 401)
        if request.method == "POST":
            length = request.headers.get("content-length")
            if length is None or not length.isdigit():
                return _json({"error": "a request body needs a Content-Length"}, 411)
            if int(length) > params.max_body_bytes:
                return _json(
                    {
                        "error": f"request body of {length} bytes exceeds the server's limit "
                        f"of {params.max_body_bytes} (--max-body-mb)"
                    },
                    413,
                )
            if request.headers.get("content-encoding", "identity") != "identity":
                return _json({"error": "compressed request bodies are not accepted"}, 415)
        return await call_next(request)

    # -- the SDK's session plumbing ----------------------------------------------------------
    @app.get("/api/v1/healthz")
    async def healthz():
        return {"status": "ok"}

    @app.post("/api/v1/client/config")
    async def client_config():
        return _json(CLIENT_CONFIG)

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
            return _json(error_body(future.exception()))
        result = future.result()
        if type(result) in ENCODERS and PROTO_CONTENT_TYPE in request.headers.get("accept", ""):
            return Response(encode_result(result), media_type=PROTO_CONTENT_TYPE)
        return _json(result)

    # -- checkpoints ---------------------------------------------------------------------------
    @app.get("/api/v1/training_runs")
    async def training_runs(limit: int = 20, offset: int = 0):
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
