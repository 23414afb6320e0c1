"""The offline loop: SFT, DPO and reward-model training straight from a dataset.

No explorer runs. Each step takes the next ``buffer.train_batch_size`` rows of the
training set (resumable, seeded order), and:

- SFT: masked NLL on assistant tokens;
- DPO: the reference logprobs of each pair are computed once, the first time the pair is
  seen, and cached on disk in the run directory (``ref_cache.safetensors``) so the
  reference model is loaded only while uncached pairs remain, and never again on resume;
- RM: a scalar head on the last non-pad token, Bradley-Terry loss on (chosen, rejected).

Pair data can also come from the model itself: ``pairs_from_samples`` on a task source
samples the starting model and pairs the reference answer with its most frequent wrong
answer (:mod:`.self_pairs`), once per run directory.

With ``buffer.eval_tasks`` set, an SFT or DPO stage also reports greedy held-out answer
accuracy (``eval/accuracy``, as an online stage does) at the start and the end: the
effect of the offline objective on the task itself, whichever way it goes.
"""

from __future__ import annotations

import functools
import time
from pathlib import Path
from typing import Any

import torch

from trinity_like.errors import TrinityError
from trinity_like.pipeline.batching import experience_batch, pair_batch
from trinity_like.pipeline.checkpoint import CheckpointManager
from trinity_like.pipeline.context import StageContext, seed_everything, start_ray_for
from trinity_like.pipeline.data import offline_set, task_set
from trinity_like.pipeline.engines import make_engine
from trinity_like.pipeline.metrics import MetricsLogger, PhaseTimer
from trinity_like.pipeline.self_pairs import build_self_pairs, source_tasks
from trinity_like.trainer.objective import objective_from_stage


class RefCache:
    """Reference logprobs of pair rows, keyed by the row's id, persisted in the run directory."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.values: dict[str, torch.Tensor] = {}
        if path.exists():
            from safetensors.torch import load_file

            self.values = dict(load_file(str(path)))

    def missing(self, keys: list[str]) -> list[str]:
        return [k for k in keys if f"{k}/c" not in self.values]  # a pair is stored as <key>/c and <key>/r

    def save(self) -> None:
        from safetensors.torch import save_file

        tmp = self.path.with_suffix(".tmp")
        save_file({k: v.contiguous() for k, v in self.values.items()}, str(tmp))
        tmp.replace(self.path)


def _row_keys(rows: list[Any]) -> list[str]:
    return [r.task_id or r.eid for r in rows]


def _pair_ref_logprob(ctx: StageContext, rows: list[Any], batch: dict[str, torch.Tensor], cache: RefCache) -> torch.Tensor:
    """``ref_logprob [2B, R]`` of a pair batch, from the cache or one reference forward."""
    keys = _row_keys(rows)
    if cache.missing(keys):
        if ctx.reference is None:
            ctx.reference = make_engine(ctx.stage, str(ctx.model_path), forward_only=True)
        ref = ctx.reference.compute_logprobs(batch)["logprob"]
        lengths = (batch["response_mask"] > 0).sum(-1)
        for i, key in enumerate(keys):  # pair i: chosen in row 2i, rejected in row 2i + 1
            cache.values[f"{key}/c"] = ref[2 * i, : lengths[2 * i]].clone()
            cache.values[f"{key}/r"] = ref[2 * i + 1, : lengths[2 * i + 1]].clone()
        cache.save()
    out = torch.zeros_like(batch["response_mask"])
    for i, key in enumerate(keys):
        c, r = cache.values[f"{key}/c"], cache.values[f"{key}/r"]
        out[2 * i, : c.numel()] = c
        out[2 * i + 1, : r.numel()] = r
    return out


def _make_batch(ctx: StageContext, rows: list[Any]) -> dict[str, torch.Tensor]:
    if ctx.stage.algorithm.schema == "pair":
        return pair_batch(rows, ctx.pad_id)
    return experience_batch(rows, ctx.pad_id)


@torch.no_grad()
def evaluate_offline(ctx: StageContext, eval_rows: list[Any], cache: RefCache | None) -> dict[str, float]:
    """Held-out loss (SFT), or preference accuracy and margin (DPO, RM), over ``eval_rows``."""
    if not eval_rows:
        return {}
    metrics: dict[str, list[float]] = {}
    bs = ctx.train_batch_size
    for i in range(0, len(eval_rows), bs):
        rows = eval_rows[i : i + bs]
        batch = _make_batch(ctx, rows)
        if "ref_logprob" in ctx.batch_needs and cache is not None:
            batch["ref_logprob"] = _pair_ref_logprob(ctx, rows, batch, cache)
        outputs = ctx.actor.compute_logprobs(batch)
        _, m = ctx.objective(outputs, batch)
        for k, v in m.items():
            metrics.setdefault(k, []).append(float(v) * len(rows))
    n = len(eval_rows)
    return {f"eval/{k}": sum(v) / n for k, v in metrics.items()}


def run_offline(stage: Any) -> dict[str, float]:
    """Train an offline stage (SFT, DPO, RM) to ``trainer.total_steps``; returns the last metrics."""
    from trinity_like.models.resolve import load_tokenizer, resolve_model_path

    cfg = stage.config
    seed_everything(cfg.seed)
    model_path = resolve_model_path(cfg.model.path)
    tokenizer = load_tokenizer(model_path)
    max_tokens = cfg.model.max_prompt_tokens + cfg.model.max_response_tokens
    schema = stage.algorithm.schema
    # Data and settings first: bad ones fail before the run directory is touched or any sampling.
    sources = {"train_data": cfg.buffer.train_data, "eval_data": cfg.buffer.eval_data}
    from_samples = {k: source_tasks(ds, f"buffer.{k}") for k, ds in sources.items() if ds is not None and ds.pairs_from_samples}

    def load(key: str, ds: Any) -> Any:  # training data cycles, held-out data is one pass
        return offline_set(ds, tokenizer, schema=schema, max_tokens=max_tokens, epochs=None if key == "train_data" else 1)

    sets = {k: load(k, ds) for k, ds in sources.items() if ds is not None and k not in from_samples}
    eval_tasks = list(task_set(cfg.buffer.eval_tasks, "buffer.eval_tasks", train=False)) if cfg.buffer.eval_tasks else None
    objective = objective_from_stage(stage, on_policy=True)
    batch_needs = frozenset(stage.needs | objective.inputs_needed())
    kind = "reward" if schema == "pair" and "scores" in batch_needs else "lm"
    if eval_tasks is not None and kind != "lm":
        raise TrinityError("buffer.eval_tasks: answer accuracy needs a language model; a reward model reports pairwise accuracy on buffer.eval_data")
    run_dir = Path(cfg.run_dir())
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.json").write_text(cfg.model_dump_json(indent=1))
    checkpoints = CheckpointManager(run_dir, cfg.checkpoint.keep_last)

    @functools.cache
    def explorer() -> Any:  # the starting model's rollout engine, made when first needed
        from trinity_like.pipeline.explorer_actor import ExplorerWorker

        return ExplorerWorker(cfg, str(model_path))

    pair_metrics: dict[str, float] = {}
    resuming = cfg.checkpoint.resume and checkpoints.latest() is not None
    for key, tasks in from_samples.items():  # pairs from the starting model's own wrong answers
        ds, summary, built = build_self_pairs(stage, sources[key], f"buffer.{key}", tasks, run_dir / "self_pairs",
                                              explorer, resuming=resuming)
        if built:  # cached reference logprobs are keyed by pair-file line: stale for new pairs
            (run_dir / "ref_cache.safetensors").unlink(missing_ok=True)
        sets[key] = load(key, ds)
        pair_metrics.update({f"self_pairs/{key}/{k}": float(v) for k, v in summary.items()})
    if eval_tasks is None:
        explorer.cache_clear()  # sampling done: free the rollout model
    train = sets["train_data"]
    eval_rows = list(sets["eval_data"]) if "eval_data" in sets else []
    ctx = StageContext(
        stage=stage, run_dir=run_dir, model_path=model_path, tokenizer=tokenizer, pad_id=int(tokenizer.pad_token_id),
        checkpoints=checkpoints,
        logger=MetricsLogger(str(run_dir), cfg.monitor.backends, total_steps=cfg.trainer.total_steps, start_step=0,
                             progress=cfg.monitor.progress, desc=cfg.name),
    )
    try:
        ctx.tasks = train  # its position is saved with each checkpoint
        ctx.objective = objective
        ctx.batch_needs = batch_needs
        ctx.train_batch_size = cfg.buffer.train_batch_size or 8
        ctx.owns_ray = start_ray_for(stage, 1 + ("ref_logprob" in ctx.batch_needs))
        ctx.actor = make_engine(stage, str(model_path), kind=kind)
        ctx.resume()
        cache = RefCache(run_dir / "ref_cache.safetensors") if "ref_logprob" in ctx.batch_needs else None
        last: dict[str, float] = {}
        if eval_tasks is not None:
            ctx.explorer = explorer()
            ctx.eval_tasks = eval_tasks
            if ctx.start_step > 0:
                ctx.explorer.update_weights(ctx.actor.state_dict(), ctx.start_step)  # in-process: no file channel
        if cfg.monitor.eval_at_start and (eval_rows or eval_tasks) and ctx.start_step == 0:
            ctx.log(0, {**pair_metrics, **evaluate_offline(ctx, eval_rows, cache), **ctx.evaluate()})
        elif pair_metrics and ctx.start_step == 0:
            ctx.log(0, pair_metrics)
        for step in range(ctx.start_step + 1, cfg.trainer.total_steps + 1):
            timer = PhaseTimer()
            t0 = time.perf_counter()
            rows = train.next_batch(ctx.train_batch_size)
            if not rows:
                raise TrinityError("the training set is empty")
            batch = _make_batch(ctx, rows)
            metrics: dict[str, float] = {}
            if cache is not None:
                with timer("reference"):
                    batch["ref_logprob"] = _pair_ref_logprob(ctx, rows, batch, cache)
            with timer("update"):
                out = ctx.actor.forward_backward(batch, ctx.objective, need_entropy=ctx.objective.need_entropy)
                metrics.update(out)
                metrics.update({f"actor/{k}": v for k, v in ctx.actor.optim_step().items()})
            if cache is not None and ctx.reference is not None and not cache.missing(_row_keys(train.rows)):
                ctx.reference.close()  # every pair's reference logprobs are cached: free the model
                ctx.reference = None
            ctx.model_version = step
            if cfg.monitor.eval_interval and step % cfg.monitor.eval_interval == 0 and step != cfg.trainer.total_steps:
                with timer("eval"):
                    metrics.update(evaluate_offline(ctx, eval_rows, cache))
            if step % cfg.checkpoint.interval == 0 or step == cfg.trainer.total_steps:
                with timer("checkpoint"):
                    ctx.checkpoint(step)
            metrics.update(timer.metrics())
            metrics["time/step"] = time.perf_counter() - t0
            ctx.log(step, metrics)
            ctx.logger.advance()
            last = metrics
        if eval_rows or eval_tasks:
            if eval_tasks is not None:
                ctx.explorer.update_weights(ctx.actor.state_dict(), cfg.trainer.total_steps)  # in-process: no file channel
            final = {**evaluate_offline(ctx, eval_rows, cache), **ctx.evaluate()}
            ctx.log(cfg.trainer.total_steps, final)
            last.update(final)
        return last
    finally:
        ctx.close()
