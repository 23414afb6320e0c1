"""Fixtures: a tiny real model and its rollout engine, for the test folders of environments
(tests/envs, tests/cookbook). A folder's conftest imports them; each folder builds its own."""

from __future__ import annotations

import pytest

from trinity_like.explorer.engine import NativeEngine
from trinity_like.models.tiny import build_tiny_model


@pytest.fixture(scope="package")
def tiny():
    return build_tiny_model(seed=0)


@pytest.fixture(scope="package")
def engine(tiny):
    model, tok = tiny
    return NativeEngine(model, tok)


@pytest.fixture(scope="package")
def tok(tiny):
    return tiny[1]
