"""Read a recipe file (YAML or TOML) into a plain dict plus the line of every key.

The line map lets every later error name ``recipe.yaml:12: trainer.optimizer.lr: ...``.
YAML is read with PyYAML's composer (so each node keeps its line); a duplicate key is an
error rather than the last-one-wins PyYAML does silently. Floats such as ``1e-5`` are
read as floats (YAML 1.2), not as strings.

A recipe is read only from a regular file of at most :data:`MAX_RECIPE_BYTES` (a FIFO would
block for ever, ``/dev/zero`` never ends), and YAML's aliases are bounded: an alias inside
the node it names (``a: &x [*x]``) is an error, as is expanding aliases past
:data:`MAX_ALIAS_NODES` nodes in all (a "billion laughs": 700 bytes of nested aliases that
expand to 10^9 nodes) or nesting past :data:`MAX_DEPTH` levels -- each naming the file and line.
"""

from __future__ import annotations

import os
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import tomllib
import yaml

from trinity_like.errors import ConfigError

KeyPath = tuple[Any, ...]

MAX_RECIPE_BYTES = 4 * 2**20  # a recipe is a few KB; anything near this is not one
MAX_ALIAS_NODES = 10_000  # nodes all the aliases of one document may expand to
MAX_DEPTH = 100  # sections, lists and values nested in one another

_FLOAT = re.compile(
    r"""^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+]?[0-9]+)?
    |[-+]?(?:[0-9][0-9_]*)(?:[eE][-+]?[0-9]+)
    |\.[0-9_]+(?:[eE][-+][0-9]+)?
    |[-+]?\.(?:inf|Inf|INF)
    |\.(?:nan|NaN|NAN))$""",
    re.X,
)


class _Loader(yaml.SafeLoader):
    """SafeLoader whose float resolver accepts ``1e-5`` like YAML 1.2 does, and whose composer bounds
    aliases and nesting (see the module doc); ``source`` names the text in its errors."""

    source = "<config>"
    with_lines = True  # "source:line: ..." (a recipe file) or "source: ..." (one override)

    def _at(self, mark: Any) -> str:
        return f"{self.source}:{mark.line + 1}" if self.with_lines else self.source

    def compose_node(self, parent: Any, index: Any) -> Any:
        event = self.peek_event()
        state = self.__dict__.setdefault("_bounds", {"open": set(), "sizes": {}, "nodes": 0, "aliased": 0, "depth": 0})
        if isinstance(event, yaml.AliasEvent):
            if event.anchor in state["open"]:
                raise ConfigError(
                    f"{self._at(event.start_mark)}: alias *{event.anchor} is inside the node &{event.anchor} "
                    "it names (a recursive alias)"
                )
            node = super().compose_node(parent, index)
            size = state["sizes"].get(event.anchor, 1)
            state["nodes"] += size
            state["aliased"] += size
            if state["aliased"] > MAX_ALIAS_NODES:
                raise ConfigError(
                    f"{self._at(event.start_mark)}: alias *{event.anchor}: aliases expand to more than "
                    f"{MAX_ALIAS_NODES} nodes in all (nested aliases, a 'billion laughs'?); write the values out"
                )
            return node
        anchor = getattr(event, "anchor", None)
        state["depth"] += 1
        if state["depth"] > MAX_DEPTH:
            raise ConfigError(f"{self._at(event.start_mark)}: nested deeper than {MAX_DEPTH} levels")
        if anchor is not None:
            state["open"].add(anchor)
        before = state["nodes"]
        try:
            node = super().compose_node(parent, index)
        finally:
            state["depth"] -= 1
            state["open"].discard(anchor)
        state["nodes"] += 1
        if anchor is not None:
            state["sizes"][anchor] = state["nodes"] - before
        return node


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


def _compose(text: str, source: str, with_lines: bool = True) -> yaml.Node | None:
    loader = _Loader(text)
    loader.source, loader.with_lines = source, with_lines
    try:
        return loader.get_single_node()
    finally:
        loader.dispose()


def parse_scalar(text: str, source: str = "override") -> Any:
    """Parse a command-line override value the way the recipe file would (aliases bounded the same way)."""
    if not text.strip():
        return ""
    try:
        node = _compose(text, source, with_lines=False)
    except yaml.YAMLError:
        return text
    if node is None:
        return None
    try:
        return _yaml_to_python(node, (), {}, source)
    except ConfigError as exc:
        raise ConfigError(str(exc).replace(f"{source}:1: ", f"{source}: ", 1)) from None


def _construct(node: yaml.Node, file: str) -> Any:
    """A scalar node's value; a tag SafeLoader refuses (``!!python/object``...) is an error at its line."""
    try:
        return _Loader("").construct_object(node, deep=True)
    except (yaml.YAMLError, ValueError, TypeError, OverflowError) as exc:  # `!!int abc` is a ValueError
        problem = getattr(exc, "problem", None) or " ".join(str(exc).split())[:200]
        raise ConfigError(f"{file}:{node.start_mark.line + 1}: bad YAML: {problem}") from None


_PLAIN = {yaml.MappingNode: "tag:yaml.org,2002:map", yaml.SequenceNode: "tag:yaml.org,2002:seq"}


def _yaml_to_python(node: yaml.Node, path: KeyPath, lines: dict[KeyPath, int], file: str) -> Any:
    lines[path] = node.start_mark.line + 1
    if type(node) in _PLAIN and node.tag != _PLAIN[type(node)]:  # read as plain data, so no other tag may apply
        raise ConfigError(f"{file}:{node.start_mark.line + 1}: bad YAML: tag {node.tag!r} is not allowed in a recipe")
    if isinstance(node, yaml.MappingNode):
        out: dict[Any, Any] = {}
        for key_node, value_node in node.value:
            if not isinstance(key_node, yaml.ScalarNode):
                raise ConfigError(
                    f"{file}:{key_node.start_mark.line + 1}: a key must be a plain value, not a list or mapping"
                )
            key = _construct(key_node, file)
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
    return _construct(node, file)


def _load_yaml(text: str, file: str) -> tuple[Any, dict[KeyPath, int]]:
    try:
        node = _compose(text, file)
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


def read_recipe_text(path: Path) -> str:
    """The text of the recipe file ``path``: a regular file (checked on the opened file, before any
    read, so a FIFO never blocks) of at most :data:`MAX_RECIPE_BYTES`, in UTF-8."""
    if not path.exists():
        raise ConfigError(f"{path}: no such recipe file")
    if path.is_dir():
        raise ConfigError(f"{path}: is a folder, not a recipe file")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # a FIFO opens at once instead of waiting for a writer
    except OSError as exc:
        raise ConfigError(f"{path}: cannot be read: {exc}") from None
    with os.fdopen(fd, "rb") as fh:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            kind = (
                "a FIFO"
                if stat.S_ISFIFO(mode)
                else "a device"
                if stat.S_ISCHR(mode) or stat.S_ISBLK(mode)
                else "a socket"
            )
            raise ConfigError(f"{path}: not a regular file ({kind}); a recipe is read from a file")
        try:
            data = fh.read(MAX_RECIPE_BYTES + 1)
        except OSError as exc:
            raise ConfigError(f"{path}: cannot be read: {exc}") from None
    if len(data) > MAX_RECIPE_BYTES:
        raise ConfigError(
            f"{path}: larger than {MAX_RECIPE_BYTES // 2**20} MB; a recipe is read up to {MAX_RECIPE_BYTES // 2**20} MB"
        )
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: cannot be read: {exc}") from None


def load_recipe(path: str | Path) -> RawRecipe:
    """Read ``path`` (.yaml/.yml/.toml) into a :class:`RawRecipe`; errors name the file and line."""
    path = Path(path)
    text = read_recipe_text(path)
    if path.suffix == ".toml":
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{path}: bad TOML: {exc}") from None
        except RecursionError:
            raise ConfigError(f"{path}: bad TOML: nested too deeply") from None
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
        node[last] = parse_scalar(value, f"override {item!r}")
        for k in [k for k in lines if k[: len(parts)] == tuple(parts)]:
            del lines[k]
        overridden[tuple(parts)] = item
    return RawRecipe(data=data, path=raw.path, lines=lines, overridden=overridden)
