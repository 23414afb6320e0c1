"""Who may drive ``trinity-like serve``: the checks every request passes before any route runs.

A web page the user visits can send requests to ``127.0.0.1`` too: a cross-site form or
``fetch`` POST of ``text/plain`` needs no CORS preflight, and a DNS-rebinding page reaches
the server under its own host name and reads the answers. So, in this order:

1. **Host** (without ``--api-key`` only): the request must be addressed to this server --
   ``localhost``, ``127.0.0.1``, ``[::1]`` or the bound address, with its port -- else 421.
   A rebound name (``evil.example:8000``) is not. With a key the key decides (step 3), so a
   server on a public address may be reached under any of its names.
2. **Origin** and **Sec-Fetch-Site**: a request a browser made for another site carries
   ``Origin: http://other-site`` (every POST) and ``Sec-Fetch-Site: cross-site`` or
   ``same-site``: refused with 403. The SDK sends neither; a page of this server's own
   origin (there is none) would be ``same-origin``.
3. **API key**, when ``--api-key`` is set: ``X-API-Key`` must equal it, else 401. Without
   one no key is checked: any ``X-API-Key``, or none, passes.
4. **Body** (POST): a ``Content-Length`` (411) of at most ``max_body_bytes`` (413), not
   compressed (415), and the route's own content type (415): ``application/json``, or
   ``application/x-protobuf`` for ``forward_backward``. ``text/plain``, forms and multipart
   bodies -- what a browser sends cross-site without asking -- are never read.

Example::

    refusal = check_request(method, path, headers, params)   # None: go on
"""

from __future__ import annotations

import hmac
from collections.abc import Mapping

from trinity_like.client.serve.config import ServeParams

PROTOBUF_ROUTES = frozenset({"/api/v1/forward_backward"})  # everything else posts JSON
SAFE_FETCH_SITES = frozenset({"same-origin", "none"})  # Sec-Fetch-Site values of a non-cross-site request


def own_hosts(params: ServeParams) -> frozenset[str]:
    """The ``Host`` values a keyless server answers: its loopback names and bound address, with its port."""
    bound = f"[{params.host}]" if ":" in params.host else params.host
    names = {"localhost", "127.0.0.1", "[::1]", bound.lower()}
    hosts = {f"{name}:{params.port}" for name in names}
    return frozenset(hosts | names if params.port == 80 else hosts)  # port 80 may be left out


def media_type(value: str | None) -> str:
    return (value or "").split(";", 1)[0].strip().lower()


def check_request(
    method: str, path: str, headers: Mapping[str, str], params: ServeParams, hosts: frozenset[str]
) -> tuple[int, str] | None:
    """``(status, message)`` of the first check (see the module doc) ``headers`` fail; None if all pass.
    ``headers``: lower-case names (Starlette's); ``hosts``: :func:`own_hosts`."""
    host = headers.get("host", "").lower()
    if params.api_key is None and host not in hosts:
        return 421, (
            f"Host {host or '(none)'!r} is not this server's: a server without --api-key answers only "
            f"requests addressed to {', '.join(sorted(hosts))}"
        )
    origin = headers.get("origin")
    if origin is not None and origin.lower() != f"http://{host}":
        return 403, f"cross-origin request (Origin {origin!r}) refused: this server takes no requests from web pages"
    site = headers.get("sec-fetch-site")
    if site is not None and site.lower() not in SAFE_FETCH_SITES:
        return 403, f"cross-site request (Sec-Fetch-Site: {site}) refused: this server takes no requests from web pages"
    if params.api_key is not None and not hmac.compare_digest(
        headers.get("x-api-key", "").encode(), params.api_key.encode()
    ):
        return 401, "missing or wrong API key (X-API-Key; the SDK's api_key / TINKER_API_KEY)"
    if method != "POST":
        return None
    length = headers.get("content-length")
    if length is None or not length.isdigit():
        return 411, "a request body needs a Content-Length"
    if int(length) > params.max_body_bytes:
        return 413, (
            f"request body of {length} bytes exceeds the server's limit of {params.max_body_bytes} (--max-body-mb)"
        )
    if headers.get("content-encoding", "identity") != "identity":
        return 415, "compressed request bodies are not accepted"
    want = "application/x-protobuf" if path in PROTOBUF_ROUTES else "application/json"
    got = media_type(headers.get("content-type"))
    if got != want:
        return 415, f"POST {path} takes Content-Type {want}, got {got or '(none)'}"
    return None
