"""The checks of a recipe's sections beyond their schema: data sets, buffer storage, monitors,
workflow and reward functions, the model.

Part of step 5 of :mod:`.resolve`: what each section names must exist before anything runs
-- a data file or folder with data files in it, a task source and its args, a registered
storage, monitor, workflow or reward function with valid args, a model that is a built-in
id or a local folder (nothing is downloaded) -- and the sections must fit the algorithm and
the mode (split modes share a SQLite buffer and a weights folder). Every error names the
recipe's file, line and key.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from trinity_like.buffer.task_sources import task_source
from trinity_like.components import AlgorithmType
from trinity_like.config.loader import Locator
from trinity_like.config.schema import Config
from trinity_like.config.slots import params_of, resolve_name
from trinity_like.errors import ConfigError, DataError
from trinity_like.registry import BUFFER_STORAGE, MONITOR, REWARD_FN, ROLLOUT_ENGINE, TRAIN_ENGINE, WORKFLOW

DATA_KEYS = ("tasks", "eval_tasks", "expert_data", "train_data", "eval_data")  # the buffer's data sets


def check_sections(cfg: Config, algo: AlgorithmType, loc: Locator) -> Any:
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
    for key in DATA_KEYS:
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
    for key in DATA_KEYS:
        ds = getattr(cfg.buffer, key)
        if ds is not None and ds.generator is not None:  # a bad generator fails here, before anything runs
            try:
                task_source(ds.generator, ds.generator_args, where=f"buffer.{key}")
            except ConfigError as exc:
                raise loc.reraise(exc) from None
    storage = resolve_name(BUFFER_STORAGE, cfg.buffer.experience.storage, loc, ("buffer", "experience", "storage"))
    params_of(storage, cfg.buffer.experience.args, "buffer.experience.args", loc)
    for i, backend in enumerate(cfg.monitor.backends):
        resolve_name(MONITOR, backend, loc, ("monitor", "backends", i))
    reward_params = None
    resolve_name(ROLLOUT_ENGINE, cfg.explorer.engine, loc, ("explorer", "engine"))  # evaluation samples too
    resolve_name(TRAIN_ENGINE, cfg.trainer.engine, loc, ("trainer", "engine"))
    if algo.use_rollout:
        workflow = resolve_name(WORKFLOW, cfg.explorer.workflow, loc, ("explorer", "workflow"))
        params_of(workflow, cfg.explorer.workflow_args, "explorer.workflow_args", loc)
        reward = resolve_name(REWARD_FN, cfg.explorer.reward_fn, loc, ("explorer", "reward_fn"))
        reward_params = params_of(reward, cfg.explorer.reward_args, "explorer.reward_args", loc)
        if cfg.explorer.eval_reward_fn is not None:
            ev = resolve_name(REWARD_FN, cfg.explorer.eval_reward_fn, loc, ("explorer", "eval_reward_fn"))
            params_of(ev, cfg.explorer.eval_reward_args, "explorer.eval_reward_args", loc)
    return reward_params


def check_model(cfg: Config, loc: Locator) -> None:
    """The model must be a built-in id or a folder with a config.json; nothing is downloaded."""
    from trinity_like.models.resolve import BUILTIN_MODELS  # transformers: only once a recipe is resolved

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


def check_data_paths(cfg: Config, loc: Locator, base: Path) -> None:
    """Every data file or folder a recipe names exists and holds data files: checked here, so the
    error names the recipe's file, line and key (the data sets read the rows when a stage starts)."""
    from trinity_like.buffer.records import data_files  # `datasets` and pyarrow: only once a recipe is resolved

    for key in DATA_KEYS:
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


def check_run_root(cfg: Config, loc: Locator) -> None:
    """The run directory can be made and written in: ``run_root`` (or a folder above it) must not
    be a file and the nearest folder that exists must be writable -- checked here, so ``validate``
    and ``--dry-run`` say it too, as one line with the recipe's line and key, before a run starts.

    Writable as the operating system answers for this process (``os.access``): a read-only
    mount is refused for root too; permission bits are not, for root, as they do not stop it."""
    run_dir = Path(cfg.run_dir()).expanduser()
    root = Path(cfg.run_root).expanduser()
    for path in (run_dir, *run_dir.parents):
        if not os.path.lexists(path):
            continue
        key = ("run_root",) if path in (root, *root.parents) else ("name",)
        if not path.is_dir():
            what = "is a file" if path.is_file() else "is not a folder"
            where = "" if path == run_dir else f" (the run directory is {run_dir})"
            raise loc.error(key, f"{path} {what}: the run directory cannot be made there{where}")
        if not os.access(path, os.W_OK | os.X_OK):
            where = "" if path == run_dir else f" (the run directory {run_dir} would be made in it)"
            raise loc.error(key, f"{path}: folder not writable by this user{where}")
        return
