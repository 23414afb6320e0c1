"""Serve-test fixtures: a tiny model folder and one server on it for the session."""

from __future__ import annotations

import os

import pytest
from _lib.serve_helpers import LOCAL_KEY, running_server

from trinity_like.models.tiny import build_tiny_model

os.environ.setdefault("TINKER_TELEMETRY", "0")  # the SDK's usage reports: nothing to send them to
# the key every SDK client here uses unless it names its own: set at import, so a module that
# runs before any test started the shared ``server`` (as on a pytest-xdist worker) has it too
os.environ["TINKER_API_KEY"] = LOCAL_KEY


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> str:
    return str(build_tiny_model(tmp_path_factory.mktemp("serve-tiny") / "model", seed=7))


@pytest.fixture(scope="session")
def server(tmp_path_factory, tiny_model):
    """(base URL, data directory) of a server on the tiny model."""
    data_dir = tmp_path_factory.mktemp("serve") / "data"
    # every serve test module makes its training clients on this one server: more than a user's one loop
    with running_server(data_dir, "--model", tiny_model, "--max-models", "64") as url:
        yield url, data_dir
