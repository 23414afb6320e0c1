"""Helpers shared by the test folders: importable as ``_lib`` because pyproject.toml's pytest
settings put tests/ on the import path (``pythonpath``); no test edits ``sys.path``.

Not collected (no ``test_*.py`` here). ``tiers.py`` decides each test's tier (unit, integration,
system) for the root conftest; docs/contributing.md explains the tiers."""
