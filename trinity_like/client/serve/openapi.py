"""The OpenAPI document of ``trinity-like serve`` (``GET /api/v1/openapi.json``).

The routes read their bodies themselves (so a malformed one is a 400 with one line, as
the SDK expects), so FastAPI cannot see what they take: each route's request model --
the SDK's own ``tinker.types`` class -- is declared beside it and written in here. Fuzzers
(tests/faults/test_serve_fuzz.py runs schemathesis) and readers get every route with its body::

    spec = openapi_spec(app, {"/api/v1/optim_step": types.OptimStepRequest, ...})
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel

PROTOBUF = "application/x-protobuf"  # a body that is a protobuf message, not JSON


def openapi_spec(app: FastAPI, bodies: Mapping[str, type[BaseModel] | str | None]) -> dict[str, Any]:
    """FastAPI's document of ``app``'s routes (paths, path and query parameters) with each POST
    route's body from ``bodies``: a pydantic model (JSON), :data:`PROTOBUF`, or None (any JSON object)."""
    spec = get_openapi(title=app.title, version=app.version, routes=app.routes)
    schemas = spec.setdefault("components", {}).setdefault("schemas", {})
    for path, body in bodies.items():
        if body == PROTOBUF:
            content = {PROTOBUF: {"schema": {"type": "string", "format": "binary"}}}
        elif body is None:
            content = {"application/json": {"schema": {"type": "object"}}}
        else:
            schema = body.model_json_schema(ref_template="#/components/schemas/{model}")
            schemas.update(schema.pop("$defs", {}))
            content = {"application/json": {"schema": schema}}
        spec["paths"][path]["post"]["requestBody"] = {"required": True, "content": content}
    return spec
