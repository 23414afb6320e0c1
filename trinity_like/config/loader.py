"""Read a recipe file (YAML or TOML) into a plain dict plus the line of every key.

The line map lets every later error name ``recipe.yaml:12: trainer.optimizer.lr: ...``.
YAML is read with PyYAML's composer (so each node keeps its line); a duplicate key is an
error rather than the last-one-wins PyYAML does silently. Floats such as ``1e-5`` are
read as floats (YAML 1.2), not as strings.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import tomllib
import yaml

from trinity_like.errors import ConfigError

KeyPath = tuple[Any, ...]

_FLOAT = re.compile(
    r"""^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+]?[0-9]+)?
    |[-+]?(?:[0-9][0-9_]*)(?:[eE][-+]?[0-9]+)
    |\.[0-9_]+(?:[eE][-+][0-9]+)?
    |[-+]?\.(?:inf|Inf|INF)
    |\.(?:nan|NaN|NAN))$""",
    re.X,
)


class _Loader(yaml.SafeLoader):
    """SafeLoader whose float resolver accepts ``1e-5`` like YAML 1.2 does."""


_Loader.yaml_implicit_resolvers = {
    k: [(tag, rx) for tag, rx in v if tag != "tag:yaml.org,2002:float"]
    for k, v in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_Loader.add_implicit_resolver("tag:yaml.org,2002:float", _FLOAT, list("-+0123456789."))


@dataclass
class RawRecipe:
    """A recipe as read: the data, its file, and the line of each key path."""

    data: dict[str, Any]
    path: Path | None = None
    lines: dict[KeyPath, int] = field(default_factory=dict)
    overridden: dict[KeyPath, str] = field(default_factory=dict)  # key path -> the override that set it

    def where(self, key_path: KeyPath) -> str:
        """``file:line`` of the deepest known prefix of ``key_path`` (or the override that set it)."""
        name = str(self.path) if self.path else "<config>"
        for n in range(len(key_path), 0, -1):
            prefix = tuple(key_path[:n])
            if prefix in self.overridden:
                return f"{name}: override {self.overridden[prefix]!r}"
            line = self.lines.get(prefix)
            if line is not None:
                return f"{name}:{line}"
        return name


def get_path(data: dict, path: KeyPath) -> tuple[bool, Any]:
    """``(True, value)`` at ``path`` in nested mappings, or ``(False, None)`` if it is not set."""
    node: Any = data
    for part in path:
        if not isinstance(node, dict) or part not in node:
            return False, None
        node = node[part]
    return True, node


class Locator:
    """Maps a key path of a (stage-merged) config to where the recipe set it.

    ``loc.error(("trainer", "total_steps"), "must be > 0")`` is the one-line
    ``recipe.yaml:9: trainer.total_steps: must be > 0`` (``stages.1.`` prefixed when the
    key was set inside a stage, ``override 'k=v'`` when the command line set it).
    """

    def __init__(self, raw: RawRecipe, stage_index: int | None, stage_data: dict | None) -> None:
        self.raw, self.stage_index, self.stage_data = raw, stage_index, stage_data or {}

    def _in_stage(self, path: KeyPath) -> bool:
        return self.stage_index is not None and bool(path) and get_path(self.stage_data, tuple(path[:1]))[0]

    def __call__(self, path: KeyPath) -> str:
        if self._in_stage(path):
            return self.raw.where(("stages", self.stage_index) + tuple(path))
        return self.raw.where(tuple(path))

    def error(self, path: KeyPath, message: str, at: KeyPath | None = None) -> ConfigError:
        """The error of key ``path``, located where ``at`` (default: ``path``) was set."""
        at = path if at is None else at
        prefix = f"stages.{self.stage_index}." if self._in_stage(at) else ""
        dotted = ".".join(str(p) for p in path)
        return ConfigError(f"{self(at)}: {prefix}{dotted}: {message}")

    def reraise(self, exc: ConfigError) -> ConfigError:
        """A ``key.path: message`` error from a component (``build_params``) with its file and line."""
        key = tuple(str(exc).split(":", 1)[0].split("."))
        return ConfigError(f"{self(key)}: {exc}")


def parse_scalar(text: str) -> Any:
    """Parse a command-line override value the way the recipe file would."""
    try:
        return yaml.load(text, Loader=_Loader) if text.strip() else ""
    except yaml.YAMLError:
        return text


def _yaml_to_python(node: yaml.Node, path: KeyPath, lines: dict[KeyPath, int], file: str) -> Any:
    lines[path] = node.start_mark.line + 1
    if isinstance(node, yaml.MappingNode):
        out: dict[Any, Any] = {}
        for key_node, value_node in node.value:
            key = _Loader("").construct_object(key_node, deep=True)
            if key in out:
                raise ConfigError(
                    f"{file}:{key_node.start_mark.line + 1}: {'.'.join(map(str, path + (key,)))}: duplicate key"
                )
            lines[path + (key,)] = key_node.start_mark.line + 1
            out[key] = _yaml_to_python(value_node, path + (key,), lines, file)
            lines[path + (key,)] = key_node.start_mark.line + 1
        return out
    if isinstance(node, yaml.SequenceNode):
        return [_yaml_to_python(v, path + (i,), lines, file) for i, v in enumerate(node.value)]
    loader = _Loader("")
    return loader.construct_object(node, deep=True)


def _load_yaml(text: str, file: str) -> tuple[Any, dict[KeyPath, int]]:
    try:
        node = yaml.compose(text, Loader=_Loader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
        line = f":{mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ConfigError(f"{file}{line}: bad YAML: {problem}") from None
    lines: dict[KeyPath, int] = {}
    if node is None:
        return {}, lines
    return _yaml_to_python(node, (), lines, file), lines


_TOML_HEADER = re.compile(r"^\s*(\[\[?)\s*([^\]]+?)\s*\]\]?\s*(#.*)?$")
_TOML_KEY = re.compile(r"^\s*([A-Za-z0-9_\-\.\"']+)\s*=")


def _toml_lines(text: str) -> dict[KeyPath, int]:
    """Lines of TOML keys, from table headers and ``key =`` lines (arrays of tables indexed)."""
    lines: dict[KeyPath, int] = {}
    table: KeyPath = ()
    array_count: dict[KeyPath, int] = {}
    for no, line in enumerate(text.splitlines(), 1):
        header = _TOML_HEADER.match(line)
        if header:
            parts = tuple(p.strip().strip("\"'") for p in header.group(2).split("."))
            if header.group(1) == "[[":
                idx = array_count.get(parts, -1) + 1
                array_count[parts] = idx
                table = parts + (idx,)
            else:
                table = parts
            lines.setdefault(parts, no)
            lines.setdefault(table, no)
            continue
        key = _TOML_KEY.match(line)
        if key:
            parts = tuple(p.strip().strip("\"'") for p in key.group(1).split("."))
            lines.setdefault(table + parts, no)
    return lines


def load_recipe(path: str | Path) -> RawRecipe:
    """Read ``path`` (.yaml/.yml/.toml) into a :class:`RawRecipe`; errors name the file and line."""
    path = Path(path)
    if not path.exists():
        raise ConfigError(f"{path}: no such recipe file")
    if path.is_dir():
        raise ConfigError(f"{path}: is a folder, not a recipe file")
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot be read: {exc}") from None
    if path.suffix == ".toml":
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{path}: bad TOML: {exc}") from None
        lines = _toml_lines(text)
    elif path.suffix in (".yaml", ".yml"):
        data, lines = _load_yaml(text, str(path))
    else:
        raise ConfigError(f"{path}: unknown recipe format {path.suffix!r} (use .yaml, .yml or .toml)")
    if not isinstance(data, dict):
        raise ConfigError(f"{path}:1: a recipe must be a mapping of sections, got {type(data).__name__}")
    return RawRecipe(data=data, path=path, lines=lines)


def apply_overrides(raw: RawRecipe, overrides: list[str]) -> RawRecipe:
    """Apply ``key.path=value`` overrides (values parsed as YAML) to a copy of ``raw``."""
    import copy

    data = copy.deepcopy(raw.data)
    lines = dict(raw.lines)
    overridden = dict(raw.overridden)
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override {item!r}: expected key.path=value")
        key, _, value = item.partition("=")
        parts: list[Any] = [int(p) if p.isdigit() else p for p in key.strip().split(".")]
        if not all(str(p) for p in parts):
            raise ConfigError(f"override {item!r}: empty key in {key!r}")
        node: Any = data
        for i, part in enumerate(parts[:-1]):
            if isinstance(node, list):
                if not isinstance(part, int) or part >= len(node):
                    raise ConfigError(
                        f"override {item!r}: {'.'.join(map(str, parts[: i + 1]))} is not an index of a list of {len(node)}"
                    )
                node = node[part]
                continue
            nxt = node.get(part)
            if nxt is None:
                nxt = node[part] = {}
            elif not isinstance(nxt, (dict, list)):
                raise ConfigError(f"override {item!r}: {'.'.join(map(str, parts[: i + 1]))} is not a section")
            node = nxt
        last = parts[-1]
        if isinstance(node, list) and (not isinstance(last, int) or last >= len(node)):
            raise ConfigError(f"override {item!r}: bad list index {last!r}")
        node[last] = parse_scalar(value)
        for k in [k for k in lines if k[: len(parts)] == tuple(parts)]:
            del lines[k]
        overridden[tuple(parts)] = item
    return RawRecipe(data=data, path=raw.path, lines=lines, overridden=overridden)
