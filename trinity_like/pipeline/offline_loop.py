"""The offline loop: SFT, DPO and reward-model training straight from a dataset.

No explorer samples training data. Each step takes the next ``train_batch_size`` rows of
the training set (resumable, seeded order) and takes one optimiser step
(:func:`.steps.update`), then ends the step as the RL loop does (:func:`.steps.end_step`),
with the same loop state (:class:`.steps.LoopState`):

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

from pathlib import Path
from typing import Any

import torch

from trinity_like.atomic import write_atomic
from trinity_like.ops import normalizers
from trinity_like.pipeline.batching import split_rows
from trinity_like.pipeline.steps import LoopState, StepHooks, StepRecord, end_step, update
from trinity_like.pipeline.verbs import StageVerbs

Batch = dict[str, torch.Tensor]


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

        write_atomic(self.path, lambda tmp: save_file({k: v.contiguous() for k, v in self.values.items()}, tmp))


def _row_keys(rows: list[Any]) -> list[str]:
    return [r.task_id or r.eid for r in rows]


def _pair_ref_logprob(stage: StageVerbs, rows: list[Any], batch: Batch, cache: RefCache) -> torch.Tensor:
    """``ref_logprob [2B, R]`` of a pair batch, from the cache or one reference forward."""
    keys = _row_keys(rows)
    if cache.missing(keys):
        ref = stage.reference().compute_logprobs(batch)["logprob"]
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


class OfflineTrainer:
    """Batches of dataset rows, their cached reference logprobs, and held-out evaluation."""

    def __init__(self, stage: StageVerbs) -> None:
        self.stage = stage
        self.trainer = stage.learner()
        self.cache = RefCache(stage.file("ref_cache.safetensors")) if "ref_logprob" in self.trainer.needs else None
        self.batch_size = stage.params.train_batch_size
        self.pairs = stage.params.pairs

    def batch(self, rows: list[Any]) -> Batch:
        stage = self.stage
        batch = stage.collate(rows)
        if self.cache is not None:
            batch["ref_logprob"] = _pair_ref_logprob(stage, rows, batch, self.cache)
        return batch

    def free_reference(self) -> None:
        """Every training pair's reference logprobs are cached: the reference model can go."""
        trainer = self.trainer
        if (
            self.cache is not None
            and trainer.reference is not None
            and not self.cache.missing(_row_keys(self.stage.training_rows()))
        ):
            trainer.reference.close()
            trainer.reference = None

    @torch.no_grad()
    def held_out(self, step: int) -> dict[str, float]:
        """Held-out loss (SFT), or preference accuracy and margin (DPO, RM), over ``buffer.eval_data``.

        Each held-out pair, with what the loss reports for it alone, goes to the stage's ``evals.jsonl``."""
        stage, trainer = self.stage, self.trainer
        rows_all = stage.held_out_rows()
        metrics: dict[str, list[float]] = {}
        items: list[dict[str, Any]] = []
        for i in range(0, len(rows_all), self.batch_size):
            rows = rows_all[i : i + self.batch_size]
            batch = self.batch(rows)
            outputs = trainer.actor.compute_logprobs(batch)
            _, m = trainer.objective(outputs, batch)
            for k, v in m.items():
                metrics.setdefault(k, []).append(float(v) * len(rows))
            if self.pairs:
                items += [self.pair_item(row, j, outputs, batch) for j, row in enumerate(rows)]
        if items:
            stage.write_evals(step, items)
        return {f"eval/{k}": sum(v) / len(rows_all) for k, v in metrics.items()}

    def pair_item(self, row: Any, j: int, outputs: Batch, batch: Batch) -> dict[str, Any]:
        """Pair ``j`` of a held-out batch as an ``evals.jsonl`` item: its texts and the loss's metrics of it alone."""
        two = torch.tensor([2 * j, 2 * j + 1])
        alone = split_rows(batch, two)
        alone.update(normalizers(alone["response_mask"]))
        mine = split_rows(outputs, two)
        _, m = self.trainer.objective(mine, alone)
        m.update(
            {
                f"{k}_{side}": float(v[i])
                for k, v in mine.items()
                if v.dim() == 1  # per-row outputs: RM scores
                for i, side in enumerate(("chosen", "rejected"))
            }
        )
        prompt, chosen, rejected = self.stage.decode([row.prompt_tokens, row.chosen_tokens, row.rejected_tokens])
        return {
            "kind": "pair",
            "task_id": row.task_id or row.eid,
            "prompt": prompt,
            "chosen": chosen,
            "rejected": rejected,
            "metrics": m,
        }

    def record(self, step: int, rows: list[Any], batch: Batch, outputs: Batch) -> None:
        """Each training pair of ``step`` with what the loss saw of it, to ``trained_pairs.jsonl``
        (:mod:`trinity_like.monitor.evals`): the outputs of the step's own forward, no extra pass."""
        self.stage.write_evals(
            step, [self.pair_item(row, j, outputs, batch) for j, row in enumerate(rows)], trained=True
        )

    def evaluate(self, step: int, version: int) -> dict[str, float]:
        """Held-out rows, and answer accuracy on held-out tasks with the current weights (``version``)."""
        self.stage.lend_weights(version)
        return {**self.held_out(step), **self.stage.evaluate(step)}


class HeldOut(StepHooks):
    """An offline step ends with the held-out loss (:meth:`OfflineTrainer.held_out`) as its evaluation."""

    def __init__(self, trainer: OfflineTrainer) -> None:
        self.trainer = trainer

    def evaluate(self, stage: StageVerbs, step: int) -> dict[str, float]:
        return self.trainer.held_out(step)


def train_offline(stage: StageVerbs) -> dict[str, float]:
    """The offline loop on a built stage, from its latest checkpoint to ``trainer.total_steps``."""
    total, eval_at_start = stage.params.total_steps, stage.params.eval_at_start
    loop = LoopState.resume(stage)
    pair_metrics = stage.data_summary()
    trainer = OfflineTrainer(stage)
    hooks = HeldOut(trainer)
    has_eval = stage.has_eval()
    if loop.step == 0 and (pair_metrics or (has_eval and eval_at_start)):
        at_start = trainer.evaluate(0, loop.model_version) if has_eval and eval_at_start else {}
        stage.log(0, {**pair_metrics, **at_start})
    last: dict[str, float] = {}
    while loop.step < total:
        rec = StepRecord(loop.step + 1)
        rows, _ = stage.next_batch(rec.step, loop.model_version)
        with rec.timer("reference"):
            batch = trainer.batch(rows)
        outputs: Batch | None = {} if trainer.pairs else None
        with stage.span("trainer", "update", rec.step):
            rec.metrics = last = update(stage, loop, rec.step, batch, rec.timer, outputs=outputs)
        trained = "skipped/nan_loss" not in last
        if outputs and trained:
            with rec.timer("record"):
                trainer.record(rec.step, rows, batch, outputs)
        trainer.free_reference()
        loop.model_version = rec.step
        rec.tokens = int(batch["attention_mask"].sum()) if trained else 0
        end_step(stage, loop, rec, hooks)
    if has_eval:
        final = trainer.evaluate(total, loop.model_version)
        stage.log(total, final)
        last.update(final)
    return last
