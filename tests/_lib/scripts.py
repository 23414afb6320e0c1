"""The repository's scripts (benchmarks/*.py, tests/faults/report.py) imported by their files: they are run as
``python <path>``, not installed as a package, and tests reach them without editing ``sys.path``."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]


def load_script(path: str) -> ModuleType:
    """The module of the script at ``path`` (relative to the repository root), loaded once per process under
    the file's own name, as ``python <path>`` names its siblings' imports. A benchmark entry point such as
    benchmarks/gpu_check.py makes its sibling modules importable itself (it is meant to run from anywhere)."""
    file = ROOT / path
    name = file.stem
    if name in sys.modules and getattr(sys.modules[name], "__file__", None) == str(file):
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, file)
    assert spec is not None and spec.loader is not None, f"{path}: not a Python file"
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses and pickle look a class's module up by name
    spec.loader.exec_module(module)
    return module
