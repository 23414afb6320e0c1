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
   that makes a swap safe; resolve the task sources of the buffer's generated datasets.
"""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pydantic

from trinity_like.components import (
    OFF,
    REQUIRED_SLOTS,
    SLOTS,
    WEIGHTED_SLOTS,
    AlgorithmType,
    ComponentSpec,
    build_params,
    optional_inputs,
    required_inputs,
)
from trinity_like.config.loader import KeyPath, Locator, RawRecipe, apply_overrides, load_recipe
from trinity_like.config.presets import apply_preset, swapped_slots
from trinity_like.config.schema import AlgorithmConfig, Config, field_default
from trinity_like.errors import ConfigError, DataError, TrinityError
from trinity_like.explorer.tasks import task_source
from trinity_like.plugins import load_plugins, loaded_plugins
from trinity_like.registry import (
    ALGORITHM_TYPE,
    BUFFER_STORAGE,
    MONITOR,
    REGISTRIES,
    REWARD_FN,
    WORKFLOW,
    UnknownNameError,
)

# The handle of a resolved slot (kept under its old name for importers).
ResolvedComponent = ComponentSpec
_DATA_KEYS = ("tasks", "eval_tasks", "expert_data", "train_data", "eval_data")  # the buffer's data sets


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


def _resolve_name(registry: Any, name: str, loc: Locator, path: KeyPath) -> Any:
    try:
        return registry.get(name)
    except UnknownNameError as exc:
        raise loc.error(path, str(exc)) from None


def _build(component: Any, values: Any, where: str, loc: Locator) -> Any:
    """``component``'s params object from ``values``; errors name the file and line of ``where``."""
    try:
        return build_params(component, values, where=where)
    except ConfigError as exc:
        raise loc.reraise(exc) from None


def _resolve_components(cfg: Config, algo: AlgorithmType, loc: Locator) -> dict[str, ComponentSpec]:
    """One :class:`ComponentSpec` per slot that is on; ``coef`` of a weighted slot taken here, the one place."""
    out: dict[str, ComponentSpec] = {}
    for slot, reg_name in SLOTS.items():
        spec = dict(getattr(cfg.algorithm, slot))
        if not spec:
            continue
        if "name" not in spec:
            raise loc.error(
                ("algorithm", slot), f"set `name` (algorithm {cfg.algorithm.type!r} does not fill this slot)"
            )
        name = spec.pop("name")
        if not isinstance(name, str):
            raise loc.error(
                ("algorithm", slot, "name"),
                f"must be a registered name, or {OFF!r} to switch the slot off (got {name!r})",
            )
        if name == OFF:  # off: the slot's other keys have nothing to configure
            if slot in REQUIRED_SLOTS or (slot == "value_loss" and algo.use_critic):
                raise loc.error(
                    ("algorithm", slot, "name"), f"cannot be {OFF!r}: algorithm {cfg.algorithm.type!r} needs a {slot}"
                )
            continue
        fn = _resolve_name(REGISTRIES[reg_name], name, loc, ("algorithm", slot, "name"))
        coef = None
        if slot in WEIGHTED_SLOTS:
            coef = spec.pop("coef", None)
            if coef is None:
                raise loc.error(
                    ("algorithm", slot, "coef"),
                    f"set the weight of the {name!r} {slot} (or name: {OFF} to switch it off)",
                    at=("algorithm", slot, "name"),
                )
            if isinstance(coef, bool) or not isinstance(coef, (int, float)) or coef < 0:
                raise loc.error(("algorithm", slot, "coef"), f"must be a number >= 0 (got {coef!r})")
            coef = float(coef)
        if slot == "value_loss" and not algo.use_critic:
            raise loc.error(
                ("algorithm", slot, "name"),
                f"algorithm {cfg.algorithm.type!r} trains no critic: nothing would use a value loss",
            )
        params = _build(fn, spec, f"algorithm.{slot}", loc)
        out[slot] = ComponentSpec(reg_name, name, params, coef)
    return out


# Where a batch field comes from, for the error of a component that asks for a missing one.
_SOURCE_OF = {
    "ref_logprob": "a reference model (an algorithm type with use_reference, or a KL slot)",
    "values": "a critic (an algorithm type with use_critic)",
    "old_values": "a critic (an algorithm type with use_critic)",
    "advantages": "an advantage slot",
    "returns": "an advantage slot or a critic",
    "scores": "a reward-model head (schema: pair)",
}


def _provided_inputs(algo: AlgorithmType, comps: dict[str, ComponentSpec]) -> set[str]:
    """Batch fields the pipeline can provide for this algorithm."""
    fields = {"logprob", "entropy", "action_mask", "num_tokens", "num_seqs"}
    if algo.schema == "pair":
        fields |= {"scores"}
    else:
        fields |= {"old_logprob", "rollout_logprob", "rewards", "group_index", "is_expert", "token_level_rewards"}
    if "advantage" in comps:
        fields |= {"advantages", "returns"}
    if algo.use_reference or "kl_loss" in comps or "kl_penalty" in comps:
        fields |= {"ref_logprob"}
    if algo.use_critic:
        fields |= {"values", "old_values", "returns"}
    return fields


def _check_inputs(algo: AlgorithmType, comps: dict[str, ComponentSpec], loc: Locator, algo_name: str) -> frozenset[str]:
    """Every input a component asks for is provided: what makes a swapped slot safe."""
    provided = _provided_inputs(algo, comps)
    own = algo.components()
    needs: set[str] = set()
    for slot, comp in comps.items():
        if slot in ("sample_strategy", "value_loss"):  # a class / the critic's loss: fed by their own stages
            continue
        req = required_inputs(comp.fn)
        if SLOTS[slot] == "KL_FN":  # a KL estimator's logprob and ref_logprob are the core's to provide
            req -= {"logprob", "ref_logprob"}
        missing = req - provided
        if missing:
            how = "" if own.get(slot) == comp.name else f"swapped in for {own[slot]!r}" if slot in own else "added"
            sources = "; ".join(f"{m} comes from {_SOURCE_OF[m]}" for m in sorted(missing) if m in _SOURCE_OF)
            raise loc.error(
                ("algorithm", slot, "name"),
                f"{comp.name!r} needs {sorted(missing)}, which algorithm {algo_name!r} does not provide"
                + (f" ({how})" if how else "")
                + (f": {sources}" if sources else "")
                + f"; it provides {', '.join(sorted(provided))}",
            )
        needs |= req
    if "kl_loss" in comps or "kl_penalty" in comps:
        needs |= {"ref_logprob"}
    return frozenset(needs)


def _check_model(cfg: Config, loc: Locator) -> None:
    """The model must be a built-in id or a folder with a config.json; nothing is downloaded."""
    from trinity_like.models.resolve import BUILTIN_MODELS

    for key in ("path", "critic_path"):
        ref = getattr(cfg.model, key)
        if ref is None or ref in BUILTIN_MODELS:
            continue
        folder = Path(ref).expanduser()
        if not (folder / "config.json").is_file():
            why = "is a folder without config.json" if folder.is_dir() else "does not exist"
            raise loc.error(
                ("model", key),
                f"model {ref!r} not found: {folder.resolve()} {why}, and it is not a built-in id "
                f"({', '.join(sorted(BUILTIN_MODELS))}); nothing is downloaded",
            )


def _check_expert_data(cfg: Config, comps: dict[str, ComponentSpec], loc: Locator) -> None:
    """Expert rows come with a sample strategy that declares ``uses_expert_data`` (MIX), and
    then the policy loss must tell them from sampled rows (it takes ``is_expert``)."""
    strategy = comps["sample_strategy"]
    mixes = bool(getattr(strategy.fn, "uses_expert_data", False))
    if mixes and cfg.buffer.expert_data is None:
        raise loc.error(
            ("buffer", "expert_data"),
            f"the sample strategy {strategy.name!r} mixes expert rows into each batch: set buffer.expert_data",
        )
    if not mixes and cfg.buffer.expert_data is not None:
        raise loc.error(
            ("buffer", "expert_data"),
            f"the sample strategy {strategy.name!r} uses no expert data; "
            "pick one that does (e.g. algorithm.type: mix) or remove buffer.expert_data",
        )
    loss = comps["policy_loss"]
    if mixes and "is_expert" not in required_inputs(loss.fn) | optional_inputs(loss.fn):
        raise loc.error(
            ("algorithm", "policy_loss", "name"),
            f"{loss.name!r} cannot tell the expert rows that "
            f"the sample strategy {strategy.name!r} mixes in from sampled ones (it takes no is_expert)",
        )


def _check_sections(cfg: Config, algo: AlgorithmType, loc: Locator) -> Any:
    online = algo.use_rollout and cfg.mode in ("both", "explore", "bench")
    if online and cfg.buffer.tasks is None and cfg.mode != "bench":
        raise loc.error(("buffer", "tasks"), f"algorithm {cfg.algorithm.type!r} explores: set buffer.tasks")
    if not algo.use_rollout and cfg.mode == "train" and cfg.buffer.train_data is None:
        raise loc.error(("buffer", "train_data"), f"offline algorithm {cfg.algorithm.type!r}: set buffer.train_data")
    if algo.use_rollout and cfg.mode in ("explore", "train"):
        # explorer and trainer run as two processes: they share the buffer file and the weights folder
        if cfg.synchronizer.method == "memory":
            raise loc.error(
                ("synchronizer", "method"),
                f"mode {cfg.mode!r} runs explorer and trainer as separate "
                "processes: weights cannot travel in memory; use 'checkpoint' (or 'auto')",
            )
        if cfg.buffer.experience.storage != "sqlite":
            raise loc.error(
                ("buffer", "experience", "storage"),
                f"mode {cfg.mode!r}: the explorer and trainer "
                f"processes share the buffer; {cfg.buffer.experience.storage!r} cannot, use 'sqlite'",
            )
    for key in _DATA_KEYS:
        ds = getattr(cfg.buffer, key)
        if (
            ds is not None
            and ds.pairs_from_samples is not None
            and (key not in ("train_data", "eval_data") or algo.schema != "pair")
        ):
            raise loc.error(
                ("buffer", key, "pairs_from_samples"),
                "builds preference pairs from tasks: only for "
                "buffer.train_data / buffer.eval_data of a pair algorithm (dpo, rm)",
            )
    for key in _DATA_KEYS:
        ds = getattr(cfg.buffer, key)
        if ds is not None and ds.generator is not None:  # a bad generator fails here, before anything runs
            try:
                task_source(ds.generator, ds.generator_args, where=f"buffer.{key}")
            except ConfigError as exc:
                raise loc.reraise(exc) from None
    storage = _resolve_name(BUFFER_STORAGE, cfg.buffer.experience.storage, loc, ("buffer", "experience", "storage"))
    _build(storage, cfg.buffer.experience.args, "buffer.experience.args", loc)
    for i, backend in enumerate(cfg.monitor.backends):
        _resolve_name(MONITOR, backend, loc, ("monitor", "backends", i))
    reward_params = None
    if algo.use_rollout:
        workflow = _resolve_name(WORKFLOW, cfg.explorer.workflow, loc, ("explorer", "workflow"))
        _build(workflow, cfg.explorer.workflow_args, "explorer.workflow_args", loc)
        reward = _resolve_name(REWARD_FN, cfg.explorer.reward_fn, loc, ("explorer", "reward_fn"))
        reward_params = _build(reward, cfg.explorer.reward_args, "explorer.reward_args", loc)
        if cfg.explorer.eval_reward_fn is not None:
            ev = _resolve_name(REWARD_FN, cfg.explorer.eval_reward_fn, loc, ("explorer", "eval_reward_fn"))
            _build(ev, cfg.explorer.eval_reward_args, "explorer.eval_reward_args", loc)
    return reward_params


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


def _check_data_paths(cfg: Config, loc: Locator, base: Path) -> None:
    """Every data file or folder a recipe names exists and holds data files: checked here, so the
    error names the recipe's file, line and key (the data sets read the rows when a stage starts)."""
    from trinity_like.buffer.datasets import data_files

    for key in _DATA_KEYS:
        ds = getattr(cfg.buffer, key)
        if ds is None or ds.path is None:
            continue
        if not Path(ds.path).expanduser().exists():
            where = (
                ""
                if Path(ds.path).expanduser().is_absolute()
                else f" (looked in the recipe's folder {base.resolve()} and the working directory {Path.cwd()})"
            )
            raise loc.error(("buffer", key, "path"), f"{ds.path}: no such data file or folder{where}")
        try:
            data_files(ds.path)
        except DataError as exc:
            raise loc.error(("buffer", key, "path"), str(exc)) from None


def resolve_stage(data: dict, loc: Locator, base: Path) -> ResolvedStage:
    alg = data.get("algorithm", {})
    default = field_default(AlgorithmConfig, "type")
    algo_name = alg.get("type", default) if isinstance(alg, dict) else default
    if not isinstance(algo_name, str):
        raise loc.error(("algorithm", "type"), f"must be a string (got {repr(algo_name)})")
    algo = _resolve_name(ALGORITHM_TYPE, algo_name, loc, ("algorithm", "type"))
    if not isinstance(algo, AlgorithmType):
        raise loc.error(("algorithm", "type"), f"{algo_name!r} is registered but is not an AlgorithmType")
    data = apply_preset(data, algo, algo_name, loc)
    data = _resolve_paths(data, base)
    cfg = _validate_schema(data, loc)
    _check_data_paths(cfg, loc, base)
    comps = _resolve_components(cfg, algo, loc)
    needs = _check_inputs(algo, comps, loc, algo_name)
    reward_params = _check_sections(cfg, algo, loc)
    if algo.use_rollout:
        _check_expert_data(cfg, comps, loc)
    _check_model(cfg, loc)
    return ResolvedStage(cfg, algo, comps, needs, reward_params)


def _stage_datas(raw: RawRecipe) -> list[tuple[dict, int | None, dict | None]]:
    data = raw.data
    stages = data.get("stages") or []
    if not isinstance(stages, list):
        raise ConfigError(f"{raw.where(('stages',))}: stages: must be a list of stage mappings")
    base = {k: v for k, v in data.items() if k != "stages"}
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
        if name in names:
            raise ConfigError(f"{raw.where(('stages', i, 'name'))}: stages.{i}.name: duplicate stage name {name!r}")
        names.add(name)
        over = {k: v for k, v in st.items() if k != "name"}
        merged = _deep_merge(base, over)
        merged["name"] = f"{base.get('name', 'run')}/{name}"
        out.append((merged, i, over))
    return out


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
    for d, i, over in _stage_datas(raw):
        stage = resolve_stage(d, Locator(raw, i, over), base)
        own = i in (None, 0) or "path" in ((over or {}).get("model") or {})
        stages.append(dataclasses.replace(stage, own_model=own))
    return RunPlan(source=raw.path, stages=stages, plugins=loaded_plugins())
