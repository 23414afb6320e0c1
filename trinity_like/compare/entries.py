"""What a comparison compares (recipes, client scripts, a YAML listing of both), and each seed's run of it.

An entry is a recipe file (``examples/grpo_add2.yaml``, or ``label=path.yaml`` to name it),
a client script (``--script "python loop.py --seed {seed} --log-path {run_dir}"``), or a
*listing*: a YAML file with one key, ``runs``, whose items each give a ``recipe`` or a
``script``, and optionally a ``label`` and ``set`` (overrides of that entry alone)::

    runs:
      - recipe: grpo_add2.yaml           # paths relative to the listing's folder
      - recipe: grpo_add2.yaml
        label: grpo_lr3e-5
        set: [trainer.optimizer.lr=3.0e-5]
      - script: python my_loop.py --seed {seed} --log-path {run_dir}

A run is one entry at one seed: the exact ``trinity-like run`` command (or the script's),
the folders it writes, and its identity (the resolved plan; for a script its command and
seed), which decides whether a finished run may be reused. A recipe that does not validate
becomes runs that carry the one-line error and never start, so the other entries still run.
"""

from __future__ import annotations

import re
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trinity_like.compare.plans import check_not_owned, flat_plan, plan_hash, seed_overrides
from trinity_like.errors import ConfigError, TrinityError

LABEL = re.compile(r"^[A-Za-z0-9_.+-]+$")
RECIPE_SUFFIXES = (".yaml", ".yml", ".toml")
PLACEHOLDERS = ("{seed}", "{run_dir}")


@dataclass(frozen=True)
class Entry:
    """One thing compared: a recipe (with its own overrides) or a script command template."""

    label: str
    where: str  # how errors name it: the argument, or "listing.yaml: runs.2"
    recipe: Path | None = None
    script: str | None = None
    overrides: tuple[str, ...] = ()


@dataclass
class Run:
    """One entry at one seed."""

    label: str
    seed: int
    folder: Path  # <out>/runs/<label>/seed_<seed>: a recipe's run directory (stages below it), a script's {run_dir}
    argv: list[str] = field(default_factory=list)
    run_dirs: list[Path] = field(default_factory=list)  # where metrics.jsonl is written, one per stage
    total_steps: int | None = None  # the last stage's steps (None: a script, whose length is its own)
    identity: dict[str, Any] = field(default_factory=dict)
    legacy_hash: str | None = None  # its hash before identities named folders relative to --out (reused too)
    error: str | None = None  # the recipe did not validate: the run never starts
    model: str | None = None  # model reference, for the memory estimate
    engine: str = "local"  # the last stage's trainer.engine (its declared traits: memory beside, threads as overrides)
    extra_models: int = 0  # reference models and critics beside the policy

    @property
    def key(self) -> str:
        return f"{self.label}/seed_{self.seed}"

    @property
    def hash(self) -> str:
        return plan_hash(self.identity)

    def same_plan(self, recorded: str | None) -> bool:
        """Whether a state file's hash is this run's (also as a comparison made before 2026-11-27 wrote it)."""
        return recorded is not None and recorded in (self.hash, self.legacy_hash)

    @property
    def command(self) -> str:
        return shlex.join(self.argv)


def _label_of(text: str, where: str) -> str:
    if not LABEL.match(text):
        raise ConfigError(f"{where}: label {text!r} must be letters, digits and _ . + - (it names a folder)")
    return text


def _script_label(command: str) -> str:
    words = shlex.split(command)
    named = next((w for w in words if w.endswith(".py")), words[0] if words else "script")
    return re.sub(r"[^A-Za-z0-9_.+-]", "_", Path(named).stem) or "script"


def _split_label(text: str) -> tuple[str | None, str]:
    """``"name=rest"`` -> ``("name", "rest")`` when ``name`` is a bare label; else ``(None, text)``."""
    head, eq, rest = text.partition("=")
    if eq and LABEL.match(head) and rest:
        return head, rest
    return None, text


def _listing(path: Path) -> list[Entry]:
    import yaml

    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"{path}: cannot be read as YAML: {' '.join(str(exc).split())}") from None
    items = data.get("runs") if isinstance(data, dict) else None
    if not isinstance(items, list) or not items or set(data) != {"runs"}:
        raise ConfigError(f"{path}: a listing has one key, runs: a list of {{recipe|script, label?, set?}}")
    out = []
    for i, item in enumerate(items):
        where = f"{path}: runs.{i}"
        if not isinstance(item, dict) or not set(item) <= {"recipe", "script", "label", "set"}:
            raise ConfigError(f"{where}: expected a mapping of recipe|script, label, set (got {item!r})")
        if ("recipe" in item) == ("script" in item):
            raise ConfigError(f"{where}: give exactly one of recipe and script")
        sets = item.get("set", [])
        if not isinstance(sets, list) or not all(isinstance(s, str) and "=" in s for s in sets):
            raise ConfigError(f"{where}.set: a list of key.path=value strings")
        if "script" in item:
            if sets:
                raise ConfigError(f"{where}.set: overrides apply to recipes; put a script's options in its command")
            out.append(_script_entry(str(item["script"]), item.get("label"), where))
            continue
        recipe = (path.parent / str(item["recipe"])).resolve()
        label = item.get("label") or recipe.stem
        out.append(Entry(_label_of(str(label), where), where, recipe=recipe, overrides=tuple(sets)))
    return out


def _script_entry(command: str, label: str | None, where: str) -> Entry:
    missing = [p for p in PLACEHOLDERS if p not in command]
    if missing:
        raise ConfigError(
            f"{where}: the command needs {' and '.join(missing)}: {{seed}} becomes each run's seed, "
            f"{{run_dir}} the folder where it writes metrics.jsonl (e.g. --seed {{seed}} --log-path {{run_dir}})"
        )
    try:
        shlex.split(command)
    except ValueError as exc:
        raise ConfigError(f"{where}: cannot split the command: {exc}") from None
    return Entry(_label_of(label or _script_label(command), where), where, script=command)


def parse_entries(recipes: list[str], scripts: list[str]) -> list[Entry]:
    """Positional recipe files and listings, then ``--script`` commands, in order; labels must differ."""
    entries: list[Entry] = []
    for arg in recipes:
        label, text = _split_label(arg)
        path = Path(text)
        if path.suffix not in RECIPE_SUFFIXES:
            raise ConfigError(f"{arg}: expected a recipe or listing file (.yaml, .yml, .toml)")
        if not path.is_file():
            raise ConfigError(f"{text}: no such file")
        if path.suffix != ".toml" and _is_listing(path):
            if label:
                raise ConfigError(f"{arg}: a listing names its own entries (label: in each item)")
            entries += _listing(path)
        else:
            entries.append(Entry(_label_of(label or path.stem, arg), arg, recipe=path.resolve()))
    for command in scripts:
        label, text = _split_label(command)
        entries.append(_script_entry(text, label, f"--script {command!r}"))
    if len(entries) < 2:
        raise ConfigError("compare needs at least two recipes or scripts (the first is the baseline)")
    seen: dict[str, str] = {}
    for e in entries:
        if e.label in seen:
            raise ConfigError(
                f"{e.where}: label {e.label!r} is also {seen[e.label]}'s; name them (label=path.yaml, or label: in a listing)"
            )
        seen[e.label] = e.where
    return entries


def _is_listing(path: Path) -> bool:
    import yaml

    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError):
        return False  # left for the recipe loader to report with its line
    return isinstance(data, dict) and "runs" in data


# -- runs ---------------------------------------------------------------------------------------
def recipe_runs(
    entry: Entry, seeds: list[int], out: Path, sets: list[str], plugins: list[str]
) -> tuple[list[Run], dict[str, Any] | None]:
    """One run per seed, and the entry's flat plan (seed aside) for the diff; on a recipe that does
    not validate, runs that carry its error and no plan."""
    from trinity_like.config import load_plan
    from trinity_like.config.loader import apply_overrides, load_recipe

    assert entry.recipe is not None
    overrides = [*sets, *entry.overrides]
    folder = out / "runs" / entry.label
    runs = [Run(entry.label, s, folder / f"seed_{s}") for s in seeds]
    try:
        check_not_owned(list(entry.overrides))
        plan = load_plan(entry.recipe, overrides, plugins)
        staged = bool(apply_overrides(load_recipe(entry.recipe), overrides).data.get("stages"))
        for run in runs:
            where = [f"run_root={folder}", f"name=seed_{run.seed}", "monitor.progress=false"]
            run_overrides = [*overrides, *seed_overrides(plan, run.seed, staged), *where]
            seeded = load_plan(entry.recipe, run_overrides, plugins)
            run.argv = [sys.executable, "-m", "trinity_like.cli", "run", "--config", str(entry.recipe)]
            run.argv += [*run_overrides, *(f"--plugin={p}" for p in plugins)]
            run.run_dirs = [Path(s.config.run_dir()) for s in seeded.stages]
            last = seeded.stages[-1]
            run.total_steps = last.config.trainer.total_steps
            flat = flat_plan(seeded)
            # the plugins this comparison names (--plugin), not every one the environment loads: an
            # unrelated plugin installed or exported (TRINITY_LIKE_PLUGINS) since does not make a run stale
            run.identity = {"plan": _under_out(flat, out), "plugins": sorted(plugins)}
            run.legacy_hash = plan_hash({"plan": flat, "plugins": seeded.plugins})
            run.model, run.engine = seeded.stages[0].config.model.path, last.config.trainer.engine
            run.extra_models = max(int(s.needs_reference) + 4 * int(s.algorithm.use_critic) for s in seeded.stages)
    except TrinityError as exc:
        message = f"{entry.where}: {' '.join(str(exc).split())}"
        for run in runs:
            run.error = message
        return runs, None
    return runs, flat_plan(plan)


def _under_out(table: dict[str, Any], out: Path) -> dict[str, Any]:
    """A run's identity names its folders relative to the comparison's: a comparison folder moved or
    copied elsewhere keeps its finished runs (they are where the identity says, under the new ``out``)."""
    root = str(out)
    return {
        key: "<out>" + value[len(root) :] if isinstance(value, str) and (value + "/").startswith(root + "/") else value
        for key, value in table.items()
    }


def script_runs(entry: Entry, seeds: list[int], out: Path) -> list[Run]:
    assert entry.script is not None
    runs = []
    for seed in seeds:
        folder = out / "runs" / entry.label / f"seed_{seed}"
        command = entry.script.replace("{seed}", str(seed)).replace("{run_dir}", shlex.quote(str(folder)))
        run = Run(entry.label, seed, folder, argv=shlex.split(command), run_dirs=[folder])
        run.identity = {"script": entry.script, "seed": seed, "run_dir": str(folder.relative_to(out))}
        run.legacy_hash = plan_hash({**run.identity, "run_dir": str(folder)})
        runs.append(run)
    return runs
