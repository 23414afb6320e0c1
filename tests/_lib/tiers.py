"""Each test's tier, decided from what its module and its fixtures use (docs/contributing.md):

- ``system``: starts Ray (a local instance or a cluster), a browser, the bubblewrap jail of the code_exec
  reward, a fuzzing run (schemathesis), or needs a GPU;
- ``integration``: starts another process (the CLI, a server, a benchmark's smoke run: anything through
  ``subprocess``), or is marked ``slow`` (the real small model);
- ``unit``: the rest, in this process only; ``pytest -m unit`` is the fast loop.

A test module's own source, the sources of the ``_lib`` helpers it imports, and the fixtures a test uses
from a conftest (with the ``_lib`` helpers they call) are read for the signals below. A test that
already carries one of the three marks keeps it (the way to overrule the rules for one test).
"""

from __future__ import annotations

import inspect
import re
import sys
from functools import cache
from pathlib import Path

import pytest

TIERS = ("unit", "integration", "system")

# (tier, what the test starts, pattern in the source): the first tier that matches, in TIERS' reverse order
SIGNALS = (
    (
        "system",
        "Ray",
        r"^\s*(import ray|from ray\b)|\bray\.init\(|backend\s*=\s*[\"']ray[\"']|[\"']ray[\"'],\s*[\"']start[\"']",
    ),
    ("system", "a browser", r"\bplaywright\b"),
    ("system", "the bubblewrap jail (code_exec)", r"\bcode_exec\b|\bbwrap\b"),
    ("system", "a fuzzing run", r"\bschemathesis\b"),
    ("integration", "another process", r"\bsubprocess\b|\bPopen\b|\bsys\.executable\b|\bmultiprocessing\b"),
    ("integration", "another process (wandb's service)", r"\bwandb\b"),
)
# Folders whose every test is at least this tier: tests/pipeline runs whole recipes (the orchestration
# layer: explorer, trainer, buffer and their threads or Ray actors), 10-50 s each (measured on 2 cores).
FOLDERS = {"pipeline": ("integration", "whole recipe runs")}
LIB = Path(__file__).resolve().parent


def _lib_sources(module) -> str:
    """The sources of the ``_lib`` helper modules that ``module`` imports names or modules from."""
    names = {
        getattr(value, "__module__", None) or getattr(value, "__name__", "")
        for value in vars(module).values()
        if inspect.isfunction(value) or inspect.isclass(value) or inspect.ismodule(value)
    }
    return "\n".join(
        _source(sys.modules[n].__file__) for n in sorted(names) if n.startswith("_lib.") and n in sys.modules
    )


@cache
def _source(file: str) -> str:
    return Path(file).read_text(encoding="utf-8")


@cache
def _module_text(module_name: str) -> str:
    module = sys.modules[module_name]
    return _source(module.__file__) + "\n" + _lib_sources(module)


def _fixture_text(item: pytest.Item) -> str:
    """The fixtures this test uses that live outside its module (conftests, ``_lib``), each with the
    ``_lib`` helpers its module imports and it names."""
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return ""
    parts = []
    for defs in info.name2fixturedefs.values():
        for fixturedef in defs:
            func = fixturedef.func
            module = sys.modules.get(func.__module__)
            if module is None or module is getattr(item, "module", None):
                continue
            try:
                source = inspect.getsource(func)
            except (OSError, TypeError):  # a built-in fixture without a source file
                continue
            parts.append(source)
            for name, value in vars(module).items():
                lib = getattr(value, "__module__", "") or ""
                if lib.startswith("_lib.") and re.search(rf"\b{re.escape(name)}\b", source):
                    parts.append(_source(sys.modules[lib].__file__))
    return "\n".join(parts)


def tier_of(item: pytest.Item) -> tuple[str, str]:
    """(tier, why) for one collected test."""
    for tier in TIERS:
        if item.get_closest_marker(tier) is not None:
            return tier, "marked"
    if item.get_closest_marker("gpu") is not None:
        return "system", "a GPU"
    folder = FOLDERS.get(item.path.parent.name) if item.path.parent.parent.name == "tests" else None
    module = getattr(item, "module", None)
    text = (_module_text(module.__name__) if module is not None else "") + "\n" + _fixture_text(item)
    for tier, what, pattern in SIGNALS:
        if re.search(pattern, text, flags=re.M):
            return tier, what
    if folder is not None:
        return folder
    if item.get_closest_marker("slow") is not None:
        return "integration", "marked slow"
    return "unit", "in this process"


def mark_tiers(items: list[pytest.Item]) -> None:
    """Give every test exactly one tier mark (``pytest -m unit``, ``-m "not system"``)."""
    for item in items:
        tier, _ = tier_of(item)
        if item.get_closest_marker(tier) is None:
            item.add_marker(getattr(pytest.mark, tier))
