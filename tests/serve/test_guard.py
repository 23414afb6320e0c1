"""The checks every request passes before a route runs (guard.py), one rule at a time, with and
without an API key; and the OpenAPI document naming every POST route's body as the guard expects it."""

from __future__ import annotations

from pathlib import Path

import pytest

from trinity_like.client.serve.config import ServeParams
from trinity_like.client.serve.guard import PROTOBUF_ROUTES, check_request, own_hosts

KEYLESS = ServeParams(data_dir=Path("unused"), port=8123)
KEYED = ServeParams(data_dir=Path("unused"), host="0.0.0.0", port=8123, api_key="tml-secret")
POST = {"host": "127.0.0.1:8123", "content-length": "2", "content-type": "application/json"}


def check(params: ServeParams, headers: dict, method: str = "POST", path: str = "/api/v1/optim_step"):
    return check_request(method, path, headers, params, own_hosts(params))


@pytest.mark.parametrize(
    ("headers", "status"),
    [
        (POST, None),
        ({**POST, "host": "localhost:8123"}, None),
        ({**POST, "host": "[::1]:8123"}, None),
        ({**POST, "host": "LOCALHOST:8123"}, None),  # host names are case-insensitive
        ({**POST, "origin": "http://127.0.0.1:8123"}, None),  # its own origin
        ({**POST, "sec-fetch-site": "same-origin"}, None),
        ({**POST, "sec-fetch-site": "none"}, None),  # typed by the user
        ({**POST, "x-api-key": "tml-anything"}, None),  # no key is checked
        ({**POST, "content-type": "application/json; charset=utf-8"}, None),
        ({**POST, "host": "evil.example:8123"}, 421),
        ({**POST, "host": "127.0.0.1:8124"}, 421),
        ({**POST, "host": "127.0.0.1"}, 421),
        ({k: v for k, v in POST.items() if k != "host"}, 421),
        ({**POST, "origin": "http://evil.example"}, 403),
        ({**POST, "origin": "null"}, 403),
        ({**POST, "origin": "http://127.0.0.1:8124"}, 403),
        ({**POST, "sec-fetch-site": "cross-site"}, 403),
        ({**POST, "sec-fetch-site": "same-site"}, 403),
        ({k: v for k, v in POST.items() if k != "content-length"}, 411),
        ({**POST, "content-length": "-1"}, 411),
        ({**POST, "content-type": "text/plain"}, 415),
        ({**POST, "content-type": "application/x-www-form-urlencoded"}, 415),
        ({**POST, "content-type": "multipart/form-data; boundary=x"}, 415),
        ({**POST, "content-type": "application/x-protobuf"}, 415),  # optim_step posts JSON
        ({k: v for k, v in POST.items() if k != "content-type"}, 415),
        ({**POST, "content-encoding": "gzip"}, 415),
    ],
)
def test_a_keyless_server_answers_only_requests_addressed_to_it(headers, status):
    refusal = check(KEYLESS, headers)
    assert (refusal and refusal[0]) == status, refusal
    if refusal is not None:
        assert "\n" not in refusal[1]


def test_protobuf_routes_take_protobuf_only():
    body = {**POST, "content-type": "application/x-protobuf"}
    assert check(KEYLESS, body, path="/api/v1/forward_backward") is None
    assert check(KEYLESS, POST, path="/api/v1/forward_backward")[0] == 415
    assert check(KEYLESS, {"host": "127.0.0.1:8123"}, method="GET", path="/api/v1/healthz") is None


def test_with_a_key_the_key_decides_and_web_pages_are_still_refused():
    keyed = {**POST, "host": "my-server.example:8123", "x-api-key": "tml-secret"}
    assert check(KEYED, keyed) is None  # any name of a public server
    assert check(KEYED, {**keyed, "x-api-key": "tml-wrong"})[0] == 401
    assert check(KEYED, {k: v for k, v in keyed.items() if k != "x-api-key"})[0] == 401
    assert check(KEYED, {**keyed, "origin": "http://evil.example"})[0] == 403
    assert check(KEYED, {**keyed, "content-type": "text/plain"})[0] == 415


def test_the_openapi_document_names_every_post_routes_body(tmp_path):
    from trinity_like.client.serve.app import build_app
    from trinity_like.client.serve.backend import Backend

    backend = Backend(ServeParams(data_dir=tmp_path))
    try:
        spec = build_app(backend).openapi()
    finally:
        backend.close()
    posts = {path: ops["post"] for path, ops in spec["paths"].items() if "post" in ops}
    assert len(posts) >= 16
    for path, op in posts.items():
        want = "application/x-protobuf" if path in PROTOBUF_ROUTES else "application/json"
        assert list(op["requestBody"]["content"]) == [want], path
    refs = str(spec["paths"]).count("#/components/schemas/")
    assert refs and all(name in spec["components"]["schemas"] for name in ("ModelInput", "AdamParams"))
