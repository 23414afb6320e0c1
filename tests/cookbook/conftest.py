"""A tiny real model and its rollout engine, shared by the cookbook's env tests (tests/_lib/tiny_engine.py)."""

from _lib.tiny_engine import engine, tiny, tok  # noqa: F401  (fixtures)
