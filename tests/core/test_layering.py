"""The core package never imports the first-party packs (algorithms, cookbook) or plugins (DESIGN.md)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

CORE = Path(__file__).resolve().parents[2] / "trinity_like"
FORBIDDEN = ("algorithms", "cookbook", "plugins", "example_plugin")


def _imports(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.append((node.lineno, node.module))
        elif (
            isinstance(node, ast.Call)
            and getattr(node.func, "attr", getattr(node.func, "id", "")) in ("import_module", "__import__")
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            out.append((node.lineno, node.args[0].value))
    return out


def test_no_core_module_imports_the_packs_or_plugins():
    offenders = [
        f"{path.relative_to(CORE.parent)}:{line}: imports {name}"
        for path in sorted(CORE.rglob("*.py"))
        for line, name in _imports(path)
        if name.split(".")[0] in FORBIDDEN
    ]
    assert not offenders, "\n".join(offenders)


def test_importing_every_core_module_loads_no_plugin():
    modules = sorted(
        ".".join(p.relative_to(CORE.parent).with_suffix("").parts).removesuffix(".__init__") for p in CORE.rglob("*.py")
    )
    code = (
        "import importlib, sys\n"
        f"for m in {modules!r}:\n"
        "    importlib.import_module(m)\n"
        "bad = [m for m in sys.modules if m.split('.')[0] in ('algorithms', 'cookbook', 'example_plugin')]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=300)


def test_the_checker_catches_a_violation(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text(
        "import os\nfrom algorithms.losses import ppo\nimportlib.import_module('plugins.x')\nimport cookbook.rl.train\n"
    )
    names = [n for _, n in _imports(bad)]
    assert "algorithms.losses" in names and "plugins.x" in names and "cookbook.rl.train" in names
