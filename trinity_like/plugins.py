"""Plugin discovery and loading: once per process, identically in every process.

A plugin is a Python module (or package) whose import registers components through the
public registries. Three ways to name one:

1. an installed distribution's entry point in the group ``trinity_like.plugins``
   (the first-party ``algorithms`` pack is found this way);
2. a dotted module name (``my_pkg.losses``), importable from ``sys.path``;
3. a path to a ``.py`` file or a package folder (``./my_plugin`` or ``./my_loss.py``),
   imported from where it lies -- nothing is copied, nothing touches site-packages.

(2) and (3) come from the recipe's ``plugins:`` list or ``--plugin`` on the command line.
A file is loaded once, however it is reached: a ``.py`` file or folder is imported under
its own module name (``my_env.py`` as ``my_env``) unless that name is another module's,
so a plugin that does ``import my_env`` and the listed ``./my_env.py`` are one module,
registered once; a file already imported under any name is not run again.
:func:`load_plugins` puts them into the ``TRINITY_LIKE_PLUGINS`` environment variable so
processes started later (Ray workers inherit it through ``ray_runtime_env``) load the same
set: call :func:`load_plugins` at the start of any process that resolves names.

A plugin that fails to import stops the run with a :class:`PluginError` that carries the
plugin's own exception (chained, and summarised with the file and line it came from).
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.metadata
import importlib.util
import os
import sys
import threading
import traceback
from collections.abc import Iterable
from pathlib import Path
from types import ModuleType

from trinity_like.errors import PluginError

ENTRY_POINT_GROUP = "trinity_like.plugins"
ENV_VAR = "TRINITY_LIKE_PLUGINS"

_lock = threading.RLock()
_loaded: dict[str, ModuleType] = {}  # spec -> module, for every plugin loaded in this process
_CORE = str(Path(__file__).resolve().parent) + os.sep  # trinity_like/: frames a plugin's failure passed through
_entry_points_done = False


def _describe_failure(what: str, exc: BaseException) -> PluginError:
    frames = traceback.extract_tb(exc.__traceback__)
    where = ""
    for frame in reversed(frames):  # the plugin's own line: not importlib's, nor the core's it called
        if "importlib" not in frame.filename and not frame.filename.startswith(_CORE):
            where = f" at {frame.filename}:{frame.lineno}"
            break
    return PluginError(f"plugin {what} failed to import: {type(exc).__name__}: {exc}{where}")


def _import_path(spec: str) -> ModuleType:
    """Import a ``.py`` file or a package folder from where it lies."""
    path = Path(spec).expanduser().resolve()
    if path.is_dir():
        init = path / "__init__.py"
        if not init.exists():
            raise PluginError(f"plugin folder {spec} has no __init__.py")
        target, search = init, [str(path)]
    elif path.is_file() and path.suffix == ".py":
        target, search = path, None
    else:
        raise PluginError(f"plugin {spec!r}: no such module, .py file or package folder")
    loaded = _module_of_file(target)
    if loaded is not None:  # already imported, under whatever name (`import my_env` in another plugin)
        return loaded
    name = path.stem
    if not _free_name(name, target):
        # Another module holds the name: a stable, unique one, so two folders both called `plugin` do not collide.
        name = f"trinity_like_plugin_{path.stem}_{hashlib.sha1(str(path).encode()).hexdigest()[:8]}"
    mod_spec = importlib.util.spec_from_file_location(name, target, submodule_search_locations=search)
    if mod_spec is None or mod_spec.loader is None:
        raise PluginError(f"plugin {spec!r}: cannot be imported")
    module = importlib.util.module_from_spec(mod_spec)
    sys.modules[name] = module
    try:
        mod_spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module


def _module_of_file(target: Path) -> ModuleType | None:
    """The module already imported from ``target`` (a ``.py`` file or a package's ``__init__.py``), if any."""
    for module in list(sys.modules.values()):
        file = getattr(module, "__file__", None)
        if isinstance(file, str) and Path(file).name == target.name and Path(file).resolve() == target:
            return module
    return None


def _free_name(name: str, target: Path) -> bool:
    """Whether ``target`` may be imported as ``name``: a valid module name that no other module holds
    and that ``sys.path`` does not resolve to another file (so ``import name`` finds this one too)."""
    if not name.isidentifier() or name.startswith("__") or name in sys.modules:
        return False
    try:
        found = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return False
    return found is None or (found.origin is not None and Path(found.origin).resolve() == target)


def _looks_like_path(spec: str) -> bool:
    return spec.endswith(".py") or "/" in spec or os.sep in spec or spec.startswith(".")


def load_plugin(spec: str) -> ModuleType:
    """Load one plugin named by a module name or a path; loading twice is a no-op."""
    with _lock:
        key = str(Path(spec).expanduser().resolve()) if _looks_like_path(spec) else spec
        if key in _loaded:
            return _loaded[key]
        try:
            module = _import_path(spec) if _looks_like_path(spec) else importlib.import_module(spec)
        except PluginError:
            raise
        except ModuleNotFoundError as exc:
            if exc.name and spec.split(".")[0] == exc.name.split(".")[0]:
                raise PluginError(
                    f"plugin {spec!r} not found: no module {exc.name!r} on sys.path "
                    f"(install it, or name a .py file or package folder)"
                ) from exc
            raise _describe_failure(repr(spec), exc) from exc
        except Exception as exc:  # the plugin's own error: re-raised, never swallowed
            raise _describe_failure(repr(spec), exc) from exc
        _loaded[key] = module
        return module


def entry_points() -> list[importlib.metadata.EntryPoint]:
    """The installed entry points of the ``trinity_like.plugins`` group, sorted by name."""
    return sorted(importlib.metadata.entry_points(group=ENTRY_POINT_GROUP), key=lambda e: e.name)


def _load_entry_points() -> None:
    global _entry_points_done
    if _entry_points_done:
        return
    _entry_points_done = True  # set first: a plugin may look names up while importing
    for ep in entry_points():
        key = f"entry-point:{ep.name}={ep.value}"
        if key in _loaded:
            continue
        try:
            loaded = ep.load()
        except Exception as exc:
            _entry_points_done = False
            raise _describe_failure(f"{ep.name!r} (entry point {ep.value!r})", exc) from exc
        _loaded[key] = loaded if isinstance(loaded, ModuleType) else sys.modules[ep.module]


_builtins_done = False


def _load_builtins() -> None:
    global _builtins_done
    _builtins_done = True
    from trinity_like.builtins import load_builtins

    load_builtins()


def _env_specs() -> list[str]:
    raw = os.environ.get(ENV_VAR, "")
    return [s for s in raw.split(os.pathsep) if s]


def load_plugins(extra: Iterable[str] = ()) -> list[str]:
    """Load the installed plugins plus ``extra`` and those in ``$TRINITY_LIKE_PLUGINS``.

    Idempotent and cheap after the first call. ``extra`` specs are appended to the
    environment variable (paths made absolute) so child processes load them too.
    Returns the keys of every plugin loaded in this process.
    """
    with _lock:
        if not _builtins_done:
            _load_builtins()
        _load_entry_points()
        specs = _env_specs()
        for spec in extra:
            spec = str(Path(spec).expanduser().resolve()) if _looks_like_path(spec) else spec
            if spec not in specs:
                specs.append(spec)
        if specs:
            os.environ[ENV_VAR] = os.pathsep.join(specs)
        for spec in specs:
            load_plugin(spec)
        return list(_loaded)


def ray_runtime_env(base: dict | None = None) -> dict:
    """A Ray ``runtime_env`` whose workers load the same plugins as this process."""
    env = dict(base or {})
    env_vars = dict(env.get("env_vars", {}))
    if os.environ.get(ENV_VAR):
        env_vars[ENV_VAR] = os.environ[ENV_VAR]
    env["env_vars"] = env_vars
    return env


def loaded_plugins() -> list[str]:
    """Keys of the plugins loaded so far in this process."""
    return list(_loaded)
