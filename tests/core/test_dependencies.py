"""The declared dependencies are honest: what the library imports is installed by a plain
``pip install trinity-like`` (or the extra that names it), and what only the tests use is
in the ``test`` extra -- which ``scripts/setup.sh`` installs (``pip install -e .[test]``),
so the README's two commands still find pytest."""

from __future__ import annotations

import ast
import sys
from importlib.metadata import packages_distributions
from pathlib import Path

import tomllib
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]
LIBRARY = ("trinity_like", "algorithms", "cookbook")  # what `pip install trinity-like` ships
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
TEST_TOOLS = {"pytest", "pytest-timeout", "pytest-xdist", "hypothesis", "schemathesis", "playwright", "ruff"}


def _names(requirements: list[str]) -> set[str]:
    return {canonicalize_name(Requirement(r).name) for r in requirements}


def imported_distributions() -> dict[str, set[str]]:
    """Installed distribution -> the library files that import one of its modules (any import,
    module level or inside a function). A module no installed distribution provides is left out:
    it cannot be checked here (``trl`` behind the ``bench`` extra, for one)."""
    providers = packages_distributions()
    found: dict[str, set[str]] = {}
    for package in LIBRARY:
        for path in (ROOT / package).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.Import):
                    modules = [alias.name for alias in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    modules = [node.module]
                else:
                    continue
                for module in modules:
                    top = module.split(".")[0]
                    if top in sys.stdlib_module_names or top in LIBRARY or top == "__future__":
                        continue
                    for dist in providers.get(top, []):
                        found.setdefault(canonicalize_name(dist), set()).add(str(path.relative_to(ROOT)))
    return found


def test_test_tools_are_only_in_the_test_extra() -> None:
    runtime = _names(PROJECT["dependencies"])
    assert not runtime & TEST_TOOLS, (
        f"test-only packages among the runtime dependencies: {sorted(runtime & TEST_TOOLS)}"
    )
    assert _names(PROJECT["optional-dependencies"]["test"]) >= TEST_TOOLS


def test_the_library_imports_only_what_it_declares() -> None:
    """Every distribution a library module imports is a runtime dependency or in an extra other than
    ``test`` (``trackers``, ``gym``, ``bench``); a module of a distribution several provide (``google``)
    needs one of them declared."""
    extras = PROJECT["optional-dependencies"]
    declared = _names(PROJECT["dependencies"]) | {
        n for name, reqs in extras.items() if name != "test" for n in _names(reqs)
    }
    providers = packages_distributions()
    missing = []
    for dist, files in sorted(imported_distributions().items()):
        siblings = {
            canonicalize_name(d) for top, ds in providers.items() if dist in map(canonicalize_name, ds) for d in ds
        }
        if dist not in declared and not (siblings & declared):
            missing.append(f"{dist} (imported by {', '.join(sorted(files)[:3])})")
    assert not missing, "imported by the library but not declared: " + "; ".join(missing)
    assert not set(imported_distributions()) & TEST_TOOLS
