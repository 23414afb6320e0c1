"""``trinity-like serve``: Tinker's HTTP protocol over the in-process client's engines.

Code written for the official ``tinker`` SDK runs against it by pointing ``base_url`` at it::

    trinity-like serve --port 8000                      # a shell: 127.0.0.1 only, no key needed
    TINKER_API_KEY=tml-local python my_tinker_script.py  # the SDK insists on a "tml-" key
    # in the script: tinker.ServiceClient(base_url="http://127.0.0.1:8000")

:mod:`.app` holds the routes, :mod:`.backend` what they do on the in-process
``ServiceClient``, :mod:`.wire` the SDK's protobuf bodies, :mod:`.paths` the ``tinker://``
paths under the data directory, :mod:`.config` the settings. docs/serve.md has the table of
every SDK call and whether it works here.
"""

from __future__ import annotations

import dataclasses
import socket

from trinity_like.client.serve.config import ServeParams

__all__ = ["ServeParams", "serve"]


def serve(params: ServeParams) -> None:
    """Serve until Ctrl-C (or SIGTERM); then queued training requests finish and the server exits."""
    import uvicorn

    from trinity_like.client.serve.app import build_app
    from trinity_like.client.serve.backend import Backend

    params.check()
    if params.port == 0:  # any free port, named in the line printed below
        with socket.socket() as probe:
            probe.bind((params.host, 0))
            params = dataclasses.replace(params, port=probe.getsockname()[1])
    app = build_app(Backend(params))
    config = uvicorn.Config(
        app,
        host=params.host,
        port=params.port,
        log_level="warning",
        timeout_graceful_shutdown=int(params.poll_seconds) + 5,
    )
    server = uvicorn.Server(config)
    print(
        f"trinity-like serve: http://{params.host}:{params.port} (data in {params.data_dir}; Ctrl-C stops)", flush=True
    )
    try:
        server.run()  # after Ctrl-C uvicorn may re-raise the signal once it has shut down, or just return
    finally:
        print("trinity-like serve: stopped", flush=True)
