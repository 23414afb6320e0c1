"""From a recipe file to a validated, resolved run plan.

Order of work (each step's errors name the file, key path and line):

1. read the file, apply ``key.path=value`` overrides;
2. load the plugins the recipe and the command line name (so their names resolve);
3. split ``stages`` (each stage = the top-level sections deep-merged with its overrides);
4. apply the algorithm type's preset (:mod:`trinity_like.config.presets`): its slots,
   per-slot params and ``defaults`` fill only what the recipe left unset; a recipe value
   that contradicts its ``requires`` is an error -- never a silent rewrite. Any slot's
   component may be swapped from the recipe or the command line
   (``algorithm.policy_loss.name=my_loss``); the algorithm's params for that slot then
   stay with its own component;
5. validate the typed schema; resolve every component name in its registry and build
   its params object (a weighted slot's ``coef`` is the slot's, a slot named ``none`` is
   off); check every input a component needs is provided by the algorithm -- the check
   that makes a swap safe (:mod:`.slots`); check what each section names exists and fits
   the algorithm and mode: data sets and their task sources, storage, monitors, workflow,
   reward functions, the model (:mod:`.checks`).
"""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pydantic

from trinity_like.components import AlgorithmType, ComponentSpec
from trinity_like.config.checks import check_data_paths, check_model, check_run_root, check_sections
from trinity_like.config.data_checks import check_data
from trinity_like.config.loader import KeyPath, Locator, RawRecipe, apply_overrides, load_recipe
from trinity_like.config.presets import apply_preset, swapped_slots
from trinity_like.config.schema import AlgorithmConfig, Config, check_name, field_default
from trinity_like.config.slots import (
    check_expert_data,
    check_inputs,
    check_rollout_correction,
    resolve_components,
    resolve_name,
)
from trinity_like.errors import ConfigError, TrinityError
from trinity_like.plugins import load_plugins, loaded_plugins
from trinity_like.registry import ALGORITHM_TYPE

# The handle of a resolved slot (kept under its old name for importers).
ResolvedComponent = ComponentSpec


@dataclass(frozen=True)
class ResolvedStage:
    config: Config
    algorithm: AlgorithmType
    components: dict[str, ComponentSpec]  # slot -> component; a slot that is off is absent
    needs: frozenset[str]  # batch fields some component asks for
    reward_params: Any = None
    own_model: bool = True  # the recipe names this stage's model.path (else it continues the previous stage)

    @property
    def dynamic_sampling(self) -> bool:
        """Drop groups of equal rewards before the update: the recipe's choice, else the algorithm's."""
        chosen = self.config.algorithm.dynamic_sampling
        return self.algorithm.dynamic_sampling if chosen is None else chosen

    @property
    def whole_groups(self) -> bool:
        """A train batch must hold whole groups: a component computes over groups (it takes
        ``group_index``: GRPO's, RLOO's advantages), or dynamic sampling drops groups."""
        return self.algorithm.use_rollout and ("group_index" in self.needs or self.dynamic_sampling)

    @property
    def train_batch_size(self) -> int:
        """Rows (pairs) per train step: ``buffer.train_batch_size``, else everything one explore step writes."""
        size = self.config.buffer.train_batch_size
        return size if size is not None else self.config.explorer.batch_size * self.config.explorer.group_size

    @property
    def needs_reference(self) -> bool:
        return "ref_logprob" in self.needs

    @property
    def swapped(self) -> dict[str, str]:
        """Slot -> the algorithm type's component, for each slot the recipe swapped (or switched off)."""
        return swapped_slots(self.algorithm, self.config.algorithm)

    @property
    def run_dir(self) -> Path:
        return Path(self.config.run_dir())


@dataclass(frozen=True)
class RunPlan:
    source: Path | None
    stages: list[ResolvedStage]
    plugins: list[str] = field(default_factory=list)


def _deep_merge(base: dict, over: dict) -> dict:
    out = copy.deepcopy(base)
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = _deep_merge(out[k], v)
        else:
            out[k] = copy.deepcopy(v)
    return out


# -- validation -------------------------------------------------------------------------
def _validate_schema(data: dict, loc: Locator) -> Config:
    try:
        return Config.model_validate(data, strict=True)
    except pydantic.ValidationError as exc:
        err = exc.errors()[0]
        path = tuple(p for p in err["loc"] if not (isinstance(p, str) and p.startswith("function-")))
        msg = err["msg"]
        if err["type"] == "extra_forbidden":
            msg = "unknown key"
            parent_model = _model_at(Config, path[:-1])
            if parent_model is not None:
                import difflib

                known = list(parent_model.model_fields)
                close = difflib.get_close_matches(str(path[-1]), known, n=1)
                msg += f"; did you mean {close[0]!r}?" if close else f" (known: {', '.join(known)})"
        elif "input" in err and err["type"] != "missing":
            msg += f" (got {repr(err['input'])})"
        raise loc.error(path, msg) from None


def _model_at(model: type[pydantic.BaseModel], path: KeyPath) -> type[pydantic.BaseModel] | None:
    import typing

    for part in path:
        if isinstance(part, int):
            continue
        f = model.model_fields.get(str(part))
        if f is None:
            return None
        ann = f.annotation
        candidates = [ann] + list(typing.get_args(ann))
        for c in candidates:
            for cc in [c] + list(typing.get_args(c)):
                if isinstance(cc, type) and issubclass(cc, pydantic.BaseModel):
                    model = cc
                    break
            else:
                continue
            break
        else:
            return None
    return model


def _resolve_paths(data: dict, base: Path) -> dict:
    """Make data-file paths relative to the recipe's folder, as a user expects."""
    buf = data.get("buffer")
    if isinstance(buf, dict):
        for key, ds in buf.items():
            if isinstance(ds, dict) and isinstance(ds.get("path"), str) and key != "experience":
                p = Path(ds["path"]).expanduser()
                if not p.is_absolute() and not p.exists() and (base / p).exists():
                    ds["path"] = str(base / p)
    return data


def resolve_stage(data: dict, loc: Locator, base: Path) -> ResolvedStage:
    alg = data.get("algorithm", {})
    default = field_default(AlgorithmConfig, "type")
    algo_name = alg.get("type", default) if isinstance(alg, dict) else default
    if not isinstance(algo_name, str):
        raise loc.error(("algorithm", "type"), f"must be a string (got {repr(algo_name)})")
    algo = resolve_name(ALGORITHM_TYPE, algo_name, loc, ("algorithm", "type"))
    if not isinstance(algo, AlgorithmType):
        raise loc.error(("algorithm", "type"), f"{algo_name!r} is registered but is not an AlgorithmType")
    data = apply_preset(data, algo, algo_name, loc)
    data = _resolve_paths(data, base)
    cfg = _validate_schema(data, loc)
    check_data_paths(cfg, loc, base)
    comps = resolve_components(cfg, algo, loc)
    needs = check_inputs(algo, comps, loc, algo_name)
    check_rollout_correction(comps, loc)
    reward_params = check_sections(cfg, algo, loc)
    check_data(cfg, algo, loc)
    if algo.use_rollout:
        check_expert_data(cfg, comps, loc)
    check_model(cfg, loc)
    check_run_root(cfg, loc)
    stage = ResolvedStage(cfg, algo, comps, needs, reward_params)
    _check_whole_groups(stage, loc)
    return stage


def _check_whole_groups(stage: ResolvedStage, loc: Locator) -> None:
    """Rows per train step are a whole number of groups when the trainer needs whole groups:
    the buffer hands out groups whole (:mod:`trinity_like.buffer.groups`), so any other size
    would train on fewer rows than the recipe says, step after step, while the rest wait."""
    size, group = stage.train_batch_size, stage.config.explorer.group_size
    if not stage.whole_groups or stage.config.mode == "bench" or size % group == 0:
        return
    why = (
        f"advantage {stage.components['advantage'].name!r} normalises over groups"
        if "advantage" in stage.components and "group_index" in stage.needs
        else "dynamic sampling drops whole groups"
        if stage.dynamic_sampling
        else "the algorithm computes over groups"
    )
    lower = max(size // group, 1) * group
    raise loc.error(
        ("buffer", "train_batch_size"),
        f"{size} rows per train step is not a whole number of groups of explorer.group_size={group} ({why}; "
        f"a batch holds whole groups): use a multiple of {group}, e.g. {lower} or {lower + group}",
    )


def _stage_datas(raw: RawRecipe) -> list[tuple[dict, int | None, dict | None]]:
    data = raw.data
    stages = data.get("stages") or []
    if not isinstance(stages, list):
        raise ConfigError(f"{raw.where(('stages',))}: stages: must be a list of stage mappings")
    base = {k: v for k, v in data.items() if k != "stages"}
    _check_name(raw, ("name",), base.get("name", field_default(Config, "name")))
    if not stages:
        return [(base, None, None)]
    out = []
    names = set()
    for i, st in enumerate(stages):
        if not isinstance(st, dict):
            raise ConfigError(f"{raw.where(('stages', i))}: stages.{i}: must be a mapping with a `name`")
        name = st.get("name")
        if not isinstance(name, str) or not name:
            raise ConfigError(f"{raw.where(('stages', i))}: stages.{i}.name: every stage needs a name")
        _check_name(raw, ("stages", i, "name"), name)
        if name in names:
            raise ConfigError(f"{raw.where(('stages', i, 'name'))}: stages.{i}.name: duplicate stage name {name!r}")
        names.add(name)
        over = {k: v for k, v in st.items() if k != "name"}
        merged = _deep_merge(base, over)
        merged["name"] = f"{base.get('name', 'run')}/{name}"
        out.append((merged, i, over))
    return out


def _check_name(raw: RawRecipe, path: KeyPath, value: Any) -> None:
    """A run or stage name is one folder name (:func:`~.schema.check_name`), checked before the
    run directory is composed from it (``<run_root>/<name>[/<stage>]``): an error with its line."""
    if not isinstance(value, str):
        raise ConfigError(f"{raw.where(path)}: {'.'.join(map(str, path))}: must be a string (got {value!r})")
    try:
        check_name(value)
    except ValueError as exc:
        raise ConfigError(f"{raw.where(path)}: {'.'.join(map(str, path))}: {exc}") from None


def declared_run_dirs(path: str | Path, overrides: list[str] | None = None) -> list[tuple[Path, str]]:
    """``(run directory, mode)`` of each stage as the recipe and overrides write them, read
    without loading plugins or validating anything (a cheap look before :func:`load_plan`,
    e.g. to refuse a run whose directory is in use at once). A value that is not text is
    left out: :func:`load_plan` reports it. Raises :class:`ConfigError` as :func:`load_plan` would."""
    out = []
    for data, _, _ in _stage_datas(apply_overrides(load_recipe(path), list(overrides or []))):
        name, root = (
            data.get("name", field_default(Config, "name")),
            data.get("run_root", field_default(Config, "run_root")),
        )
        mode = data.get("mode", field_default(Config, "mode"))
        if all(isinstance(v, str) for v in (name, root, mode)):
            out.append((Path(root) / name, mode))
    return out


def load_plan(path: str | Path, overrides: list[str] | None = None, plugins: list[str] | None = None) -> RunPlan:
    """Load, validate and resolve a recipe. Raises :class:`ConfigError` with file and line."""
    raw = apply_overrides(load_recipe(path), list(overrides or []))
    base = raw.path.parent if raw.path else Path.cwd()
    datas = _stage_datas(raw)  # run and stage names checked before plugins (and torch) load
    specs = raw.data.get("plugins", [])
    if not isinstance(specs, list) or not all(isinstance(s, str) for s in specs):
        raise ConfigError(f"{raw.where(('plugins',))}: plugins: must be a list of module names or paths")
    resolved_specs = []
    for s in specs:
        p = Path(s).expanduser()
        looks_path = s.endswith(".py") or "/" in s or s.startswith(".")
        resolved_specs.append(str(base / p) if looks_path and not p.is_absolute() else s)
    try:
        load_plugins(resolved_specs)
    except TrinityError as exc:
        raise type(exc)(f"{raw.where(('plugins',))}: {exc}") from exc.__cause__
    try:
        load_plugins(list(plugins or []))
    except TrinityError as exc:
        raise type(exc)(f"--plugin: {exc}") from exc.__cause__
    stages = []
    for d, i, over in datas:
        stage = resolve_stage(d, Locator(raw, i, over), base)
        own = i in (None, 0) or "path" in ((over or {}).get("model") or {})
        stages.append(dataclasses.replace(stage, own_model=own))
    return RunPlan(source=raw.path, stages=stages, plugins=loaded_plugins())
