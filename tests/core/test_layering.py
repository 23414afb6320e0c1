"""The core's layers: every import goes to the same layer or a lower one, and the core never
imports the first-party packs (algorithms, cookbook) or plugins: they are found through the
``trinity_like.plugins`` entry point like a third party's (docs/architecture.md, "The map").

Every ``import`` counts: at module level or inside a function, ``from . import x``, and
``importlib.import_module("trinity_like.x")`` / ``__import__`` with a constant name. A piece
two layers share lives in the lower one. The table is repeated, in the same order, in
``docs/architecture.md`` ("Layers"); a test holds the two equal.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

CORE = Path(__file__).resolve().parents[2] / "trinity_like"
ARCHITECTURE = CORE.parent / "docs" / "architecture.md"
FORBIDDEN = ("algorithms", "cookbook", "plugins", "example_plugin")

# The layers of trinity_like, lowest first: a package or top-level module (``trinity_like``
# itself is the package's __init__) may import its own layer and the ones before it.
LAYERS: tuple[tuple[str, ...], ...] = (
    (
        "trinity_like",
        "errors",
        "atomic",
        "fault_points",
        "malloc",
        "shm",
        "stopping",
        "threads",
        "builtins",
    ),  # no trinity_like imports but errors
    ("plugins", "registry"),  # the registries and plugin loading
    ("components", "experience", "ops"),  # component contracts, rows, tensor helpers
    ("monitor", "buffer", "models"),  # metrics and their sinks; data sets and storages; models and tokenizers
    ("cpu_share",),  # what the engines of one machine share: the CPU cores
    ("trainer",),  # the train engines and the objective
    ("explorer",),  # the rollout engine, workflows, rewards (it receives the trainer's weights)
    ("config",),  # the typed recipe, resolved against the registries and turned into the engines' params
    ("envs",),  # environments over the rollout engine
    ("pipeline", "client"),  # the two front doors: recipe loops and the Tinker-compatible client
    ("runner", "rm_check", "view", "compare"),  # applications: run a plan, check a reward model, view a run, compare
    ("cli",),  # the command line over all of them
)


def layer_of(unit: str) -> int:
    for i, units in enumerate(LAYERS):
        if unit in units:
            return i
    raise KeyError(unit)


def unit_of(module: str) -> str:
    """``trinity_like.explorer.engine`` -> ``explorer``; ``trinity_like`` -> ``trinity_like``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def module_name(path: Path, root: Path) -> str:
    return ".".join(path.relative_to(root.parent).with_suffix("").parts).removesuffix(".__init__")


def _imports(path: Path, package: str = "") -> list[tuple[int, str]]:
    """``(line, module)`` of every import in ``path``; relative ones resolved against ``package``."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0 and node.module:
                out.append((node.lineno, node.module))
            elif node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([node.module] if node.module else []))
                out += [(node.lineno, base)] if node.module else [(node.lineno, f"{base}.{a.name}") for a in node.names]
        elif (
            isinstance(node, ast.Call)
            and getattr(node.func, "attr", getattr(node.func, "id", "")) in ("import_module", "__import__")
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            out.append((node.lineno, node.args[0].value))
    return out


def layer_violations(root: Path) -> list[str]:
    """One line per import of ``root``'s package (a ``trinity_like`` tree) that goes up a layer,
    or from or to a package the table does not place."""
    found = []
    for path in sorted(root.rglob("*.py")):
        mod = module_name(path, root)
        package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        where = f"{path.relative_to(root.parent)}"
        try:
            mine = layer_of(unit_of(mod))
        except KeyError:
            found.append(f"{where}: {unit_of(mod)} is in no layer of LAYERS")
            continue
        for line, name in _imports(path, package):
            if name.split(".")[0] != root.name:
                continue
            target = unit_of(name)
            try:
                theirs = layer_of(target)
            except KeyError:
                found.append(f"{where}:{line}: imports {name}: {target} is in no layer of LAYERS")
                continue
            if theirs > mine:
                found.append(
                    f"{where}:{line}: {unit_of(mod)} (layer {mine}) imports {name}, {target} (layer {theirs}) above it"
                )
    return found


def test_every_core_import_goes_to_the_same_or_a_lower_layer():
    found = layer_violations(CORE)
    assert not found, "imports against the layer order (tests/core/test_layering.py LAYERS):\n" + "\n".join(found)


def test_the_checker_catches_a_planted_violation(tmp_path):
    pkg = tmp_path / "trinity_like"
    (pkg / "pipeline").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "errors.py").write_text("import importlib\n\ndef f():\n    importlib.import_module('trinity_like.cli')\n")
    (pkg / "pipeline" / "__init__.py").write_text("")
    (pkg / "pipeline" / "stage.py").write_text(
        "from trinity_like.errors import x\n\n\ndef g():\n    from ..cli import main\n"
    )
    (pkg / "cli.py").write_text("from trinity_like.pipeline import stage\n")
    (pkg / "nowhere.py").write_text("")
    found = layer_violations(pkg)
    assert found == [
        "trinity_like/errors.py:4: errors (layer 0) imports trinity_like.cli, cli (layer 11) above it",
        "trinity_like/nowhere.py: nowhere is in no layer of LAYERS",
        "trinity_like/pipeline/stage.py:5: pipeline (layer 9) imports trinity_like.cli, cli (layer 11) above it",
    ]


def test_the_layer_table_in_the_architecture_doc_is_this_one():
    text = ARCHITECTURE.read_text(encoding="utf-8")
    section = text.split("## Layers", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if re.match(r"\|\s*\d+\s*\|", line)]
    documented = tuple(tuple(re.findall(r"`([a-z_]+)`", row.split("|")[2])) for row in rows)
    assert documented == LAYERS


def test_no_core_module_imports_the_packs_or_plugins():
    offenders = [
        f"{path.relative_to(CORE.parent)}:{line}: imports {name}"
        for path in sorted(CORE.rglob("*.py"))
        for line, name in _imports(path)
        if name.split(".")[0] in FORBIDDEN
    ]
    assert not offenders, "\n".join(offenders)


def test_importing_every_core_module_loads_no_plugin():
    modules = sorted(module_name(p, CORE) for p in CORE.rglob("*.py"))
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


# the recipe loops and the protocol they are typed against: they read ``pipeline/loop_params.py``'s LoopParams
LOOPS = ("rl_loop", "async_loop", "offline_loop", "explorer_process", "steps", "verbs")


def recipe_readers(root: Path) -> list[str]:
    """One line per import of ``trinity_like.config`` (the recipe) from a module of the trainer,
    the explorer or the loops (:data:`LOOPS`): they take their own params objects, built from the
    recipe by ``config/engine_params.py`` (the loops': ``pipeline/loop_params.py``)."""
    found = []
    paths = [path for unit in ("trainer", "explorer") for path in sorted((root / unit).rglob("*.py"))]
    paths += [root / "pipeline" / f"{m}.py" for m in LOOPS if (root / "pipeline" / f"{m}.py").is_file()]
    for path in paths:
        mod = module_name(path, root)
        package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        found += [
            f"{path.relative_to(root.parent)}:{line}: imports {name}"
            for line, name in _imports(path, package)
            if name == f"{root.name}.config" or name.startswith(f"{root.name}.config.")
        ]
    return found


def test_the_trainer_and_the_explorer_never_read_the_recipe():
    found = recipe_readers(CORE)
    assert not found, (
        "the recipe is turned into engine params in trinity_like/config/engine_params.py "
        "(the loops' in trinity_like/pipeline/loop_params.py):\n" + "\n".join(found)
    )


def test_the_recipe_check_catches_a_planted_import(tmp_path):
    pkg = tmp_path / "trinity_like"
    for unit in ("trainer", "explorer"):
        (pkg / unit).mkdir(parents=True)
        (pkg / unit / "__init__.py").write_text("")
    (pkg / "trainer" / "engines.py").write_text("from trinity_like.config.schema import Config\n")
    (pkg / "explorer" / "worker.py").write_text("def f():\n    from ..config import load_plan\n")
    (pkg / "explorer" / "fine.py").write_text("from trinity_like.configs import x\nfrom trinity_like import errors\n")
    (pkg / "pipeline").mkdir()
    (pkg / "pipeline" / "steps.py").write_text("from ..config.schema import Config\n")
    (pkg / "pipeline" / "build.py").write_text("from trinity_like.config.schema import Config\n")  # not a loop
    assert recipe_readers(pkg) == [
        "trinity_like/trainer/engines.py:1: imports trinity_like.config.schema",
        "trinity_like/explorer/worker.py:2: imports trinity_like.config",
        "trinity_like/pipeline/steps.py:1: imports trinity_like.config.schema",
    ]
