"""Mode ``bench``: evaluate every checkpoint of a run directory on the held-out tasks."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from trinity_like.config import ResolvedStage
from trinity_like.config.data_checks import system_prompt_of
from trinity_like.config.engine_params import explorer_params
from trinity_like.errors import TrinityError
from trinity_like.explorer.worker import ExplorerWorker
from trinity_like.monitor.evals import EVALS_FILE
from trinity_like.monitor.logger import MetricsLogger
from trinity_like.pipeline.checkpoint import CheckpointManager
from trinity_like.pipeline.data_sources import StageData, task_set
from trinity_like.pipeline.run_dir import RunDir
from trinity_like.pipeline.stage import Stage
from trinity_like.trainer.lora import export_checkpoint, is_adapter_folder


def run_bench(spec: ResolvedStage) -> dict[str, float]:
    """Greedy accuracy of each checkpoint of ``run_dir`` on ``buffer.eval_tasks``; logs one row per checkpoint."""
    from trinity_like.models.resolve import load_tokenizer

    cfg = spec.config
    if cfg.buffer.eval_tasks is None:
        raise TrinityError("mode bench: set buffer.eval_tasks (the held-out tasks to evaluate on)")
    run_dir = Path(cfg.run_dir())
    checkpoints = CheckpointManager(run_dir, cfg.checkpoint.keep_last)
    found = checkpoints.list()
    if not found:
        raise TrinityError(f"mode bench: no checkpoints in {run_dir / 'checkpoints'}")
    system = system_prompt_of(cfg.buffer, "eval_tasks")
    data = StageData(
        eval_tasks=list(task_set(cfg.buffer.eval_tasks, "buffer.eval_tasks", train=False, system_prompt=system))
    )
    logger = MetricsLogger(
        str(run_dir / "bench"),
        cfg.monitor.backends,
        total_steps=len(found),
        start_step=0,
        progress=cfg.monitor.progress,
        desc=f"bench {cfg.name}",
    )
    run = RunDir(path=run_dir, logger=logger, checkpoints=checkpoints, eval_log=run_dir / "bench" / EVALS_FILE)
    last: dict[str, float] = {}
    merged = Path(tempfile.mkdtemp(prefix="bench-merged-"))
    try:
        for path in found:
            checkpoints.verify(path)
            model = path / "model"
            if is_adapter_folder(model):  # a LoRA run's checkpoint: evaluate adapter merged into its base
                model = export_checkpoint(model, merged / path.name)
            stage = Stage(
                spec=spec,
                role="explore",
                model_path=model,
                tokenizer=load_tokenizer(model),
                data=data,
                run=run,
                explorer=ExplorerWorker(explorer_params(cfg), str(model)),
            )
            step = int(CheckpointManager.read_state(path)["step"])
            last = stage.evaluate(step)
            logger.log(step, last)
            logger.write(f"{path.name}: accuracy {last['eval/accuracy']:.3f} +- {last['eval/accuracy_stderr']:.3f}")
            logger.advance()
            stage.explorer.close()
    finally:
        logger.close()
        shutil.rmtree(merged, ignore_errors=True)
    return last
