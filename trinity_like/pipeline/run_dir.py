"""A stage's run directory and everything the stage writes there, behind one handle.

:meth:`RunDir.open` claims the directory for a role first (:mod:`.run_lock`: a second run on
it stops there, before anything is written), then writes ``config.json`` and opens what the
stage writes as it runs: the metrics logger (``metrics.jsonl``, TensorBoard, the progress
bar; an explorer process logs under ``explorer/``), the checkpoints (:mod:`.checkpoint`),
the timeline of when each actor was busy (``timeline.jsonl``,
:mod:`~trinity_like.monitor.timeline`) and the held-out answers (``evals.jsonl``,
:mod:`~trinity_like.monitor.evals`). :meth:`RunDir.close` comes last::

    run = RunDir.open(config, "both")
    with run.span("trainer", "update", step):
        ...
    run.logger.log(step, metrics)
    run.close()                      # the logger's sinks, then the lock
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path

from trinity_like.config.schema import Config
from trinity_like.errors import TrinityError
from trinity_like.monitor.evals import EVALS_FILE
from trinity_like.monitor.logger import MetricsLogger
from trinity_like.monitor.timeline import TIMELINE_FILE, Timeline
from trinity_like.pipeline.checkpoint import CheckpointManager
from trinity_like.pipeline.run_lock import RunLock


def inside_run_root(cfg: Config) -> Path:
    """``cfg.run_dir()`` if it resolves (links followed) to a folder below ``run_root``, else a
    :class:`TrinityError` before anything is created. The schema already allows only plain
    names (:func:`~trinity_like.config.schema.check_name`); this holds for any ``Config``, and
    for a run folder that is a link to elsewhere."""
    path = Path(cfg.run_dir())
    root, resolved = Path(cfg.run_root).resolve(), path.resolve()
    if root not in resolved.parents:
        raise TrinityError(
            f"run directory {path} resolves to {resolved}, not a folder inside run_root {root}: a run "
            "writes only there (a plain name=..., and no symbolic link out of run_root)"
        )
    return path


FRESH_ROLES = ("both", "offline")  # one process owns the folder (split modes share it: never moved under the other)


def set_aside(path: Path, cfg: Config) -> str | None:
    """A run that will start from step 0 in a folder an earlier run wrote (it never saved a checkpoint,
    or ``checkpoint.resume: false``) starts in a clean folder: the earlier files move, kept whole, to
    the first free ``<name>.old-<k>`` beside it (their steps would otherwise be drawn twice by
    ``plot`` and ``view``). Returns the line that says so, or None when there was nothing to move."""
    if cfg.checkpoint.resume and CheckpointManager(path, cfg.checkpoint.keep_last).list():
        return None  # resumed: the loop continues the earlier run's record
    earlier = [p for p in path.iterdir() if not p.name.startswith(".lock-")]
    if not earlier:
        return None
    k = 1
    while path.with_name(f"{path.name}.old-{k}").exists():
        k += 1
    aside = path.with_name(f"{path.name}.old-{k}")
    aside.mkdir()
    for p in earlier:
        p.rename(aside / p.name)
    why = "checkpoint.resume is false" if cfg.checkpoint.resume is False else "it saved no checkpoint to resume from"
    return f"{path}: starting a clean run; the earlier run's files moved to {aside} ({why})"


@dataclass
class RunDir:
    """The run directory of one stage and what is written there."""

    path: Path
    logger: MetricsLogger  # step metrics to every monitor, and lines for people
    checkpoints: CheckpointManager
    eval_log: Path | None = None  # where evaluations append each held-out answer (None: nowhere)
    timeline: Timeline | None = None  # when each actor was busy (None: not recorded)
    lock: RunLock | None = None  # the stage's claim on the directory, released by close()
    steps: dict[str, int] = field(default_factory=dict)  # actor -> the step of its latest span (a death's step)

    @classmethod
    def open(cls, cfg: Config, role: str) -> RunDir:
        """Claim ``cfg.run_dir()`` for ``role``, write ``config.json`` and open the logger."""
        path = inside_run_root(cfg)
        lock = RunLock.acquire(path, role)  # before anything is written: a second run on the directory stops here
        note = set_aside(path, cfg) if role in FRESH_ROLES else None
        (path / "config.json").write_text(cfg.model_dump_json(indent=1))
        explorer_only = role == "explore"  # an explorer process logs beside the trainer, not over it
        logger = MetricsLogger(
            str(path / "explorer" if explorer_only else path),
            cfg.monitor.backends,
            total_steps=cfg.trainer.total_steps,
            start_step=0,
            progress=cfg.monitor.progress,
            desc=f"{cfg.name} explorer" if explorer_only else cfg.name,
        )
        if note:
            logger.write(note)
        return cls(
            path=path,
            logger=logger,
            checkpoints=CheckpointManager(path, cfg.checkpoint.keep_last),
            eval_log=path / EVALS_FILE,
            timeline=Timeline(path / TIMELINE_FILE),
            lock=lock,
        )

    def span(self, actor: str, phase: str, step: int) -> AbstractContextManager[None]:
        """Record the body as a span of ``actor`` in the timeline, if the directory keeps one."""
        self.steps[actor] = step
        return self.timeline.span(actor, phase, step) if self.timeline is not None else nullcontext()

    def close(self) -> None:
        self.logger.close()
        if self.lock is not None:
            self.lock.release()
