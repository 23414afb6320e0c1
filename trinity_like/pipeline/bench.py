"""``bench`` mode: evaluate every checkpoint of a run directory on the held-out tasks."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trinity_like.errors import TrinityError


def run_bench(stage: Any) -> dict[str, float]:
    """Greedy accuracy of each checkpoint of ``run_dir`` on ``buffer.eval_tasks``; logs one row per checkpoint."""
    from trinity_like.models.resolve import load_tokenizer
    from trinity_like.pipeline.explorer_actor import ExplorerWorker
    from trinity_like.pipeline.checkpoint import CheckpointManager
    from trinity_like.pipeline.context import StageContext
    from trinity_like.pipeline.data import task_set
    from trinity_like.pipeline.metrics import MetricsLogger

    cfg = stage.config
    if cfg.buffer.eval_tasks is None:
        raise TrinityError("mode bench: set buffer.eval_tasks (the held-out tasks to evaluate on)")
    run_dir = Path(cfg.run_dir())
    checkpoints = CheckpointManager(run_dir, cfg.checkpoint.keep_last)
    found = checkpoints.list()
    if not found:
        raise TrinityError(f"mode bench: no checkpoints in {run_dir / 'checkpoints'}")
    eval_tasks = list(task_set(cfg.buffer.eval_tasks, "buffer.eval_tasks", train=False))
    logger = MetricsLogger(str(run_dir / "bench"), cfg.monitor.backends, total_steps=len(found), start_step=0,
                           progress=cfg.monitor.progress, desc=f"bench {cfg.name}")
    last: dict[str, float] = {}
    try:
        for path in found:
            CheckpointManager.verify(path)
            tokenizer = load_tokenizer(path / "model")
            ctx = StageContext(stage=stage, run_dir=run_dir, model_path=path / "model", tokenizer=tokenizer,
                               pad_id=int(tokenizer.pad_token_id), logger=logger, checkpoints=checkpoints)
            ctx.explorer = ExplorerWorker(cfg, str(path / "model"))
            ctx.eval_tasks = eval_tasks
            step = int(CheckpointManager.read_state(path)["step"])
            last = ctx.evaluate()
            logger.log(step, last)
            logger.write(f"{path.name}: accuracy {last['eval/accuracy']:.3f} +- {last['eval/accuracy_stderr']:.3f}")
            logger.advance()
    finally:
        logger.close()
    return last
