"""docs/architecture.md matches the code: every package and top-level module of the core in
its map, every CLI command in its command table, every registry in its registry table."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from trinity_like import cli, registry

ROOT = Path(__file__).resolve().parents[2]
DOC = (ROOT / "docs" / "architecture.md").read_text()


def section(title: str) -> str:
    return DOC.split(f"## {title}", 1)[1].split("\n## ", 1)[0]


def test_the_map_names_every_package_and_top_level_module():
    core = ROOT / "trinity_like"
    units = [f"trinity_like/{p.name}/" for p in core.iterdir() if p.is_dir() and (p / "__init__.py").exists()]
    units += [p.name for p in core.glob("*.py") if p.name != "__init__.py"]
    the_map = section("The map")
    missing = [u for u in units if f"`{u}`" not in the_map and f"`trinity_like/{u}`" not in the_map]
    assert not missing, f"docs/architecture.md's map leaves out {missing}"
    for pack in ("algorithms/", "cookbook/"):
        assert f"`{pack}`" in the_map


def test_the_command_table_lists_every_cli_command():
    parser = cli.build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    documented = set(re.findall(r"^\| `trinity-like ([a-z-]+)", section("The command line"), flags=re.M))
    assert documented == set(sub.choices), f"documented {sorted(documented)}, parser has {sorted(sub.choices)}"


def test_the_registry_table_lists_every_registry():
    documented = set(re.findall(r"^\| `([A-Z_]+)` \|", section("Where a plugin attaches"), flags=re.M))
    assert documented == set(registry.REGISTRIES), (
        f"documented {sorted(documented)}, registry.py has {sorted(registry.REGISTRIES)}"
    )
