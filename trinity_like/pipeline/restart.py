"""A worker's death does not end the run: the stage is built again and resumes from its checkpoint.

What can die while the run's own process lives on: a verl worker (the train engine's FSDP
ranks, Ray actors: :mod:`~trinity_like.trainer.verl_watch`) and the explorer actor
(``explorer.placement: ray``, or beside verl's workers: :class:`~trinity_like.explorer.worker.RemoteExplorer`),
in any mode that starts them -- ``both``, ``train``, ``explore`` and the offline stages. The
local engine and an in-process explorer are the run's own process: their death is the run's,
and the same command resumes it. A death reaches the driver as a
:class:`~trinity_like.errors.WorkerDiedError` from the call that waited on the dead process.

:func:`run_restartable` then does inside the job what a user does by running the same
command again, and nothing else: it closes the stage (what is left of the worker group and
the explorer, the buffer), builds it again in the same run directory and under the same Ray,
and runs the loop, which resumes as every loop does -- from the latest checkpoint, verified
file by file, with its weights, optimiser, data positions, RNG and the buffer's claims
(:meth:`.stage.Stage.load_checkpoint`; an explorer process from ``explorer/state.json``).
So a restarted run trains exactly what an uninterrupted one trains
(``tests/faults/test_verl_worker_kill.py``, ``tests/faults/test_worker_restart.py``).

Up to ``trainer.max_restarts`` deaths are restarted; each says so on one log line and as
``fault/restarts`` (how many so far) in ``metrics.jsonl`` at the step it died in::

    restart 1 of 2: verl worker rank 1 of 2 (pid 4242) died during forward/backward (...), in step 2; resuming from checkpoint step_000001

One more ends the run with the error's own line, which says how to resume by hand.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from trinity_like.config import ResolvedStage
from trinity_like.errors import WorkerDiedError
from trinity_like.pipeline.build import build_stage
from trinity_like.pipeline.stage import Stage

Loop = Callable[[Stage], dict[str, float]]


def run_restartable(spec: ResolvedStage, role: str, loop: Loop) -> dict[str, float]:
    """Build the stage for ``role`` and run ``loop`` on it, restarting both after a worker's
    death (see the module doc); returns the loop's last metrics."""
    limit = spec.config.trainer.max_restarts
    stage: Stage | None = build_stage(spec, role)
    before = saved_state(stage)  # what the job started from (checkpoint.resume: false ignores it)
    restarts = 0
    try:
        while True:
            try:
                return loop(stage)
            except WorkerDiedError as exc:
                if restarts >= limit:
                    if restarts:
                        raise WorkerDiedError(
                            f"{exc.what}, after {restarts} restart(s) in this run (trainer.max_restarts={limit})",
                            exc.part,
                            exc.aftermath,
                        ) from None
                    raise
                restarts += 1
                step = stage.run.steps.get(exc.part, 0)
                again = spec if saved_state(stage) == before else resuming(spec)
                stage.run.logger.write(  # before the rebuild, which takes seconds
                    f"restart {restarts} of {limit}: {exc.what}, in step {step}; "
                    f"resuming from {resume_point(stage, again)}"
                )
                stage.log(step, {"fault/restarts": float(restarts)})
                dead, stage = stage, None
                stage = rebuild(dead, again, role)  # on failure it has closed what it could
    finally:
        if stage is not None:
            stage.close()


def saved_state(stage: Stage) -> str | None:
    """What a resume of ``stage`` reads now: the latest checkpoint's name (the explorer
    process: its ``explorer/state.json``), None if nothing."""
    if stage.role == "explore":
        path = stage.run_dir / "explorer" / "state.json"
        return path.read_text() if path.exists() else None
    latest = stage.run.checkpoints.latest()
    return latest.name if latest is not None else None


def resuming(spec: ResolvedStage) -> ResolvedStage:
    """``spec`` with ``checkpoint.resume: true``: once this job has saved its own state, a
    restart resumes from it even where the job itself was told to start afresh."""
    cfg = spec.config
    checkpoint = cfg.checkpoint.model_copy(update={"resume": True})
    return dataclasses.replace(spec, config=cfg.model_copy(update={"checkpoint": checkpoint}))


def resume_point(stage: Stage, spec: ResolvedStage) -> str:
    """Where ``stage`` built again from ``spec`` will resume, in words."""
    if stage.role == "explore":
        from trinity_like.pipeline.explorer_process import ExplorerState

        saved = ExplorerState(stage.run_dir).load() if spec.config.checkpoint.resume else None
        return f"explorer/state.json (after step {saved['step']})" if saved else "the start (nothing explored yet)"
    latest = stage.run.checkpoints.latest() if spec.config.checkpoint.resume else None
    return f"checkpoint {latest.name}" if latest is not None else "the start (no checkpoint yet)"


def rebuild(stage: Stage, spec: ResolvedStage, role: str) -> Stage:
    """Close ``stage`` but its run directory (lock, logger) and Ray, and build it again there."""
    owns_ray, run = stage.resources.owns_ray, stage.run
    stage.resources.owns_ray = False  # the new stage runs under the same Ray
    try:
        try:
            # Stage.close but the run directory
            if stage.trainer is not None:
                stage.trainer.close()  # a verl group: its survivors killed, its placement group removed
            if stage.explorer is not None:
                stage.explorer.close()
            stage.resources.close()
            if stage.storage is not None:
                stage.storage.close()
        except BaseException:
            run.close()
            raise
        if run.logger.bar is not None:
            run.logger.bar.reset()  # the resume moves it to the checkpoint's step
        new = build_stage(spec, role, run=run)  # a failed build closes what it built and the run directory
    except BaseException:
        if owns_ray:
            import ray

            ray.shutdown()
        raise
    new.resources.owns_ray = owns_ray
    return new
