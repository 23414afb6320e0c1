"""The registries every pluggable component lives in, and plugin loading.

One :class:`Registry` type serves every kind of component: functions, classes and
declarative values (an ``AlgorithmType``), registered by a decorator or a call. A duplicate
name is an error naming both registration sites; an unknown name is an error that lists the
registered names and the closest match; every entry carries a one-line description (its
docstring's first line) that ``trinity-like list`` prints. It is a dict with those rules:
mmengine's ``Registry``, which it once wrapped, takes no values (only callables) and adds
scopes and build-from-config that nothing here uses.

Example -- registering and resolving a policy loss::

    from trinity_like.registry import POLICY_LOSS_FN

    @POLICY_LOSS_FN.register_module("my_loss")
    def my_loss(*, logprob, advantages, action_mask):
        \"\"\"REINFORCE without a baseline.\"\"\"
        ...

    POLICY_LOSS_FN.get("my_loss") is my_loss        # True
    POLICY_LOSS_FN.get("my_los")                    # UnknownNameError: ... did you mean 'my_loss'?

Names are looked up only after :func:`trinity_like.plugins.load_plugins` has run in the
process (``get`` calls it), so every process -- the CLI, a Ray worker -- sees the same
entries: the installed plugins' (the first-party ``algorithms`` pack among them) plus the
ones named by the config or the ``TRINITY_LIKE_PLUGINS`` environment variable.
"""

from __future__ import annotations

import difflib
import inspect
from collections.abc import Iterator
from typing import Any, TypeVar

from trinity_like.errors import TrinityError

T = TypeVar("T")


class RegistryError(TrinityError):
    """A registry was used wrongly: a duplicate name, or an unknown one."""


class UnknownNameError(RegistryError, KeyError):
    """A name that is not registered was looked up."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0])


def first_line(obj: Any) -> str:
    """The first non-empty line of ``obj``'s ``description`` attribute or docstring, or ``""``.

    Instances registered as values (an ``AlgorithmType``) carry a ``description`` field;
    functions and classes carry a docstring.
    """
    desc = getattr(obj, "description", None)
    if isinstance(desc, str) and not (inspect.isfunction(obj) or inspect.isclass(obj)):
        doc = desc
    else:
        doc = (
            inspect.getdoc(obj) if (inspect.isfunction(obj) or inspect.isclass(obj) or inspect.ismodule(obj)) else None
        ) or ""
    for line in doc.splitlines():
        if line.strip():
            return line.strip()
    return ""


def _origin(obj: Any, key: str) -> str:
    """Where ``obj`` comes from: ``module.qualname (file:line)``, the file and line being the code that
    registered it (the first frame outside this module); a value (an AlgorithmType) is named by its key
    in the registering module."""
    frame = inspect.currentframe()
    while frame is not None and frame.f_code.co_filename == __file__:
        frame = frame.f_back
    site = f"{frame.f_code.co_filename}:{frame.f_lineno}" if frame is not None else "?"
    if inspect.isfunction(obj) or inspect.isclass(obj):
        return f"{obj.__module__}.{obj.__qualname__} ({site})"
    module = frame.f_globals.get("__name__", "?") if frame is not None else "?"
    return f"{module}.{key} ({site})"


class Registry:
    """A named table of components (functions or classes), filled by decorators.

    >>> REG = Registry("demo")
    >>> @REG.register_module("double")
    ... def double(x):
    ...     '''Twice x.'''
    ...     return 2 * x
    >>> REG.get("double")(3), REG.describe("double")
    (6, 'Twice x.')
    """

    def __init__(self, name: str, kind: str = "") -> None:
        self.name = name
        self.kind = kind or name.lower().replace("_", " ")
        self._entries: dict[str, Any] = {}  # name -> component, filled only by register_module
        self._origin: dict[str, str] = {}

    # -- registration ---------------------------------------------------------------
    def register_module(self, name: str | None = None, *, force: bool = False, module: Any = None) -> Any:
        """Register ``module`` under ``name`` (default: its ``__name__``).

        Used as a decorator (``@REG.register_module("x")``) or called directly with
        ``module=``. A name that is already taken is an error unless ``force=True``.
        """
        if name is not None and (not isinstance(name, str) or not name):
            raise RegistryError(f"{self.name}: a name must be a non-empty string, got {name!r}")

        def _register(obj: T) -> T:
            key = name or getattr(obj, "__name__", None)
            if not key:
                raise RegistryError(f"{self.name}: cannot infer a name for {obj!r}")
            origin = _origin(obj, key)
            if key in self._entries and not force:
                # Both places, so the fix is clear: rename one, or stop loading one file twice.
                raise RegistryError(
                    f"{self.name}: the name {key!r} is already registered by {self._origin.get(key, '?')}; "
                    f"registered again by {origin}: give one of them another name (or load only one of them)"
                )
            self._entries[key] = obj
            self._origin[key] = origin
            return obj

        if module is not None:
            return _register(module)
        return _register

    # -- lookup ---------------------------------------------------------------------
    @staticmethod
    def _ensure_plugins() -> None:
        from trinity_like.plugins import load_plugins

        load_plugins()

    def get(self, name: str) -> Any:
        """The component registered as ``name``; plugins are loaded first."""
        self._ensure_plugins()
        if name in self._entries:
            return self._entries[name]
        raise UnknownNameError(self.unknown_message(name))

    def unknown_message(self, name: str) -> str:
        names = sorted(self._entries)
        close = difflib.get_close_matches(str(name), names, n=1, cutoff=0.5)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        known = ", ".join(names) if names else "(none registered)"
        return f"unknown {self.kind} {name!r}{hint} (registered: {known})"

    # Every read loads plugins first, so all processes see the same entries.
    def __contains__(self, name: object) -> bool:
        self._ensure_plugins()
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        self._ensure_plugins()
        return len(self._entries)

    def names(self) -> list[str]:
        self._ensure_plugins()
        return sorted(self._entries)

    def describe(self, name: str) -> str:
        """One-line description of an entry: its docstring's first line."""
        return first_line(self.get(name))

    def origin(self, name: str) -> str:
        """Dotted path of the object registered as ``name``, and the file and line that registered it."""
        return self._origin.get(name, "?")

    def items(self) -> list[tuple[str, Any]]:
        self._ensure_plugins()
        return sorted(self._entries.items())

    def __repr__(self) -> str:
        return f"Registry({self.name!r}, {len(self)} entries)"


# The registries. Their names are the ones the config and `trinity-like list` use.
ALGORITHM_TYPE = Registry("ALGORITHM_TYPE", "algorithm type")
POLICY_LOSS_FN = Registry("POLICY_LOSS_FN", "policy loss")
ADVANTAGE_FN = Registry("ADVANTAGE_FN", "advantage function")
KL_FN = Registry("KL_FN", "KL estimator")
ENTROPY_LOSS_FN = Registry("ENTROPY_LOSS_FN", "entropy loss")
SAMPLE_STRATEGY = Registry("SAMPLE_STRATEGY", "sample strategy")
WORKFLOW = Registry("WORKFLOW", "workflow")
REWARD_FN = Registry("REWARD_FN", "reward function")
BUFFER_STORAGE = Registry("BUFFER_STORAGE", "buffer storage")
MONITOR = Registry("MONITOR", "monitor")
TASK_SOURCE = Registry("TASK_SOURCE", "task source")  # `buffer.<key>.generator` (trinity_like.explorer.tasks)
ENV = Registry("ENV", "environment")  # env factories: a task -> a group of envs (trinity_like.envs)
REWARD_TRANSFORM = Registry(
    "REWARD_TRANSFORM", "reward transform"
)  # a batch's rewards -> new rewards (clip, normalise)
ROLLOUT_ENGINE = Registry(
    "ROLLOUT_ENGINE", "rollout engine"
)  # `explorer.engine`: an EngineSpec -> a RolloutEngine (trinity_like.explorer.engines)
TRAIN_ENGINE = Registry(
    "TRAIN_ENGINE", "train engine"
)  # `trainer.engine`: a TrainEngineSpec -> a TrainEngine (trinity_like.trainer.engines)
ROLLOUT_CORRECTION = Registry(
    "ROLLOUT_CORRECTION", "rollout correction"
)  # `algorithm.rollout_correction`: the sampler-trainer gap -> per-token weights and mask (trainer/objective.py)

REGISTRIES: dict[str, Registry] = {
    r.name: r
    for r in (
        ALGORITHM_TYPE,
        POLICY_LOSS_FN,
        ADVANTAGE_FN,
        KL_FN,
        ENTROPY_LOSS_FN,
        SAMPLE_STRATEGY,
        WORKFLOW,
        REWARD_FN,
        BUFFER_STORAGE,
        MONITOR,
        TASK_SOURCE,
        ENV,
        REWARD_TRANSFORM,
        ROLLOUT_ENGINE,
        TRAIN_ENGINE,
        ROLLOUT_CORRECTION,
    )
}


def find_registry(name: str) -> Registry:
    """Look a registry up by name, case-insensitively (``policy_loss_fn`` works)."""
    key = name.upper().replace("-", "_")
    if key in REGISTRIES:
        return REGISTRIES[key]
    close = difflib.get_close_matches(key, list(REGISTRIES), n=1, cutoff=0.5)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    raise UnknownNameError(f"unknown registry {name!r}{hint} (registries: {', '.join(REGISTRIES)})")
