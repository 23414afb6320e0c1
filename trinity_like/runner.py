"""Run a resolved plan: its stages one after another, each in its mode.

A later stage starts from the final weights of the stage before it (SFT warm-up, then
GRPO): unless a stage names its own ``model.path``, it is pointed at the previous stage's
last checkpoint (a LoRA stage's adapter merged into its base first).
"""

from __future__ import annotations

import dataclasses
import os
import signal
import sqlite3
import sys
from pathlib import Path

from trinity_like import stopping
from trinity_like.config import ResolvedStage, RunPlan
from trinity_like.errors import TrinityError


def _chain(stage: ResolvedStage, previous: Path | None, user_set_model: bool) -> ResolvedStage:
    if previous is None or user_set_model:
        return stage
    model = stage.config.model.model_copy(update={"path": str(previous)})
    return dataclasses.replace(stage, config=stage.config.model_copy(update={"model": model}))


def _final_model(stage: ResolvedStage) -> Path | None:
    """The model folder the next stage starts from: the last checkpoint's, or, for a LoRA
    stage, its adapter merged into the base (``<run_dir>/merged/<step>``, written once)."""
    from trinity_like.pipeline.checkpoint import CheckpointManager
    from trinity_like.trainer.lora import export_checkpoint, is_adapter_folder

    latest = CheckpointManager(Path(stage.config.run_dir())).latest()
    if latest is None:
        return None
    model = latest / "model"
    if not is_adapter_folder(model):
        return model
    merged = Path(stage.config.run_dir()) / "merged" / latest.name
    return merged if (merged / "config.json").is_file() else export_checkpoint(model, merged)


def run_stage(spec: ResolvedStage) -> dict[str, float]:
    """Run one stage in its mode: the loop of :mod:`trinity_like.pipeline` that fits it."""
    cfg = spec.config
    if cfg.mode == "bench":
        from trinity_like.pipeline.evaluate_checkpoints import run_bench

        return run_bench(spec)
    from trinity_like.pipeline.restart import run_restartable

    if not spec.algorithm.use_rollout:  # SFT, DPO, RM: straight from a dataset
        from trinity_like.pipeline.offline_loop import train_offline

        if cfg.buffer.eval_tasks is not None and "scores" in spec.needs:
            raise TrinityError(
                "buffer.eval_tasks: answer accuracy needs a language model; a reward model reports "
                "pairwise accuracy on buffer.eval_data"
            )
        return run_restartable(spec, "offline", train_offline)  # a dead verl worker: again, from the checkpoint
    from trinity_like.pipeline.async_loop import run_concurrent
    from trinity_like.pipeline.explorer_process import run_explore
    from trinity_like.pipeline.rl_loop import run_online, run_trainer

    loop = {"both": run_online, "explore": run_explore, "train": run_trainer}[cfg.mode]
    if cfg.mode == "both" and cfg.synchronizer.offset >= 1 and cfg.synchronizer.concurrent:
        loop = run_concurrent  # the explorer explores while the trainer trains (docs/async.md)
    return run_restartable(spec, cfg.mode, loop)  # a dead worker: the stage again, from its checkpoint


def _quiet_libraries() -> None:
    """Our progress bar is the one a user reads; library bars for loading weights are noise."""
    import os

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
    # "Generating train split" for every new data file; `datasets` itself loads only when one is read
    os.environ.setdefault("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")
    if sys.modules.get("datasets") is not None:
        sys.modules["datasets"].disable_progress_bars()


def probe_run_dirs(plan: RunPlan) -> None:
    """Refuse at once (:class:`~trinity_like.pipeline.run_lock.RunInUseError`) when a live run
    holds a stage's run directory, before seconds go into loading models and data; each
    stage still takes its lock for real when it opens the directory."""
    from trinity_like.pipeline.run_lock import RunLock

    for stage in plan.stages:
        cfg = stage.config
        if cfg.mode == "bench":  # reads checkpoints, writes only its own bench/ folder: no lock
            continue
        RunLock.probe(Path(cfg.run_dir()), cfg.mode if stage.algorithm.use_rollout else "offline")


def probe_recipe(path: str | Path, overrides: list[str] | None = None) -> None:
    """:func:`probe_run_dirs` from the recipe's text alone, before :func:`~trinity_like.config.load_plan`
    imports plugins and models (the bulk of a start: 7 s idle, 20 s and more on a busy machine),
    so ``trinity-like run`` on a directory in use refuses at once. Locks go by the written
    ``mode``; a recipe that does not parse is left for ``load_plan`` to report."""
    from trinity_like.config.resolve import declared_run_dirs
    from trinity_like.errors import ConfigError
    from trinity_like.pipeline.run_lock import LOCKS_OF_ROLE, RunLock

    try:
        declared = declared_run_dirs(path, overrides)
    except ConfigError:
        return
    for run_dir, mode in declared:
        if mode in LOCKS_OF_ROLE:  # bench takes no lock
            RunLock.probe(run_dir, mode)


def run_plan(plan: RunPlan) -> int:
    with stopping.taking_signals():
        return _run_stages(plan)


def _run_stages(plan: RunPlan) -> int:
    """Run every stage; returns the process exit status (128 + the signal when asked to stop:
    :mod:`trinity_like.stopping`)."""

    current: str | None = None
    try:
        probe_run_dirs(plan)
        _quiet_libraries()
        previous: Path | None = None
        for stage in plan.stages:
            stage = _chain(stage, previous, stage.own_model)
            current = stage.config.run_dir()
            metrics = run_stage(stage)
            summary = ", ".join(
                f"{k}={v:.4g}" for k, v in sorted(metrics.items()) if k.startswith(("eval/", "reward/"))
            )
            print(f"{stage.config.name}: done{': ' + summary if summary else ''}", flush=True)
            previous = _final_model(stage)
    except stopping.StopRequested as exc:
        stopping.end_children()
        sys.stderr.write(stopped_line(exc, current) + "\n")
        return exc.exit_status
    return 0


def _buffer_rows(run_dir: Path) -> str | None:
    """What the SQLite buffer holds, read-only (None when the run has none)."""
    from trinity_like.buffer.sqlite_storage import AVAILABLE, CLAIMED, SqliteParams

    path = run_dir / SqliteParams().path  # the storage's own default file and status codes
    if not path.is_file():
        return None
    try:
        with sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=5.0) as db:
            total = db.execute("SELECT COUNT(*) FROM state").fetchone()[0]
            left = db.execute("SELECT COUNT(*) FROM state WHERE status IN (?, ?)", (AVAILABLE, CLAIMED)).fetchone()[0]
    except sqlite3.Error:
        return None
    return f"{total} rows in the buffer ({left} not trained yet)"


def kept(run_dir: str | os.PathLike) -> str:
    """One clause: the checkpoint a rerun resumes from and what the buffer holds."""
    from trinity_like.pipeline.checkpoint import CheckpointManager

    folder = Path(run_dir)
    try:
        latest = CheckpointManager(folder).latest()
    except TrinityError as exc:
        latest, why = None, f" ({exc})"
    else:
        why = ""
    if latest is None:
        what = f"no checkpoint yet{why}: the same command starts this stage over"
    else:
        what = f"checkpoint {latest.name} ({latest}): the same command resumes from it"
    rows = _buffer_rows(folder)
    return f"kept {rows + '; ' if rows else ''}{what}"


def stopped_line(exc: stopping.StopRequested, run_dir: str | os.PathLike | None) -> str:
    name = signal.Signals(exc.signum).name
    if run_dir is None:
        return f"trinity-like: stopped by {name} before a stage started; nothing to resume"
    return f"trinity-like: stopped by {name}; {kept(run_dir)}"
