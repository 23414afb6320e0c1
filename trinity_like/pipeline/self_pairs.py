"""Preference pairs from the model's own mistakes (``pairs_from_samples`` on pair data).

For a DPO or reward-model stage whose ``buffer.train_data`` (or ``eval_data``) names
*tasks* (a generator or a task file) with ``pairs_from_samples: N``, the starting model
answers every task N times with the explorer's sampling and reward function, and each task
it gets wrong at least once becomes one pair:

- ``prompt``: the task's chat messages;
- ``chosen``: the task's reference answer;
- ``rejected``: the model's most frequent wrong response (responses that ended on their
  own are preferred over ones cut at the token limit; ties go to the first sampled).

A task the model always answers right gives no pair (``all_right`` in the summary). The
pairs are written once to ``<run_dir>/self_pairs/<name>.jsonl`` with a ``.json`` summary;
a resumed run reads them back instead of sampling again (so a resumed stage trains on the
pairs of the *starting* model, as the fresh run did). A summary that does not match the
current source (other tasks, sample count, sampling or model) is rebuilt.

Correct means the full reward (``reward >= 1``; ``exact_match`` gives 0 or 1).
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections import Counter
from pathlib import Path
from typing import Any, Callable

from trinity_like.config.schema import DatasetConfig
from trinity_like.errors import TrinityError

CHUNK = 32  # tasks per explorer call (progress and memory)


def _pair(task: Any, samples: list[Any]) -> dict[str, Any] | None:
    """The pair of one task from its sampled experiences, or None when every sample was right."""
    wrong = [e for e in samples if (e.reward or 0.0) < 1.0]
    if not wrong:
        return None
    finished = [e for e in wrong if e.finish_reason != "length"] or wrong
    texts = [e.info["response_text"].strip() for e in finished]
    rejected, _ = Counter(texts).most_common(1)[0]  # Counter keeps first-seen order among ties
    return {"prompt": task.messages(), "chosen": task.answer, "rejected": rejected}


def _signature(cfg: Any, source: DatasetConfig, model_path: str) -> dict[str, Any]:
    return {
        "source": source.model_dump(mode="json"),
        "model": str(model_path),
        "sampling": cfg.explorer.sampling.model_dump(mode="json"),
        "max_response_tokens": cfg.model.max_response_tokens,
        "reward_fn": [cfg.explorer.reward_fn, cfg.explorer.reward_args],
        "seed": cfg.seed,
    }


def source_tasks(source: DatasetConfig, where: str) -> list[Any]:
    """The tasks a ``pairs_from_samples`` source names (loaded up front: bad data fails before any sampling)."""
    from trinity_like.pipeline.data import task_set

    return list(task_set(source.model_copy(update={"pairs_from_samples": None}), where, train=False))


def build_self_pairs(
    stage: Any, source: DatasetConfig, where: str, tasks: list[Any], out_dir: Path, get_explorer: Callable[[], Any]
) -> tuple[DatasetConfig, dict[str, Any]]:
    """Sample the model on ``tasks`` and write its pairs; returns the pair file's config and a summary.

    ``get_explorer()`` gives an :class:`~trinity_like.pipeline.explorer_actor.ExplorerWorker`
    holding the starting weights; it is called only when the pairs are not on disk.
    """
    from trinity_like.pipeline.context import sampling_params

    cfg = stage.config
    model_path = cfg.model.path
    name = where.rsplit(".", 1)[-1]
    path, meta_path = out_dir / f"{name}.jsonl", out_dir / f"{name}.json"
    signature = _signature(cfg, source, model_path)
    pair_config = DatasetConfig(path=str(path), shuffle=source.shuffle, seed=source.seed, epochs=source.epochs)
    if meta_path.exists() and path.exists():
        meta = json.loads(meta_path.read_text())
        if meta.get("signature") == signature:
            return pair_config, meta["summary"]
    explorer = get_explorer()
    n = int(source.pairs_from_samples)
    pairs: list[dict[str, Any]] = []
    right = sampled = 0
    progress = _progress(cfg, len(tasks), f"{cfg.name}: pairs from samples ({where})")
    try:
        for i in range(0, len(tasks), CHUNK):
            chunk = tasks[i : i + CHUNK]
            # a seed per chunk: the same seed would give every chunk the same random draws
            result = explorer.run(chunk, dataclasses.replace(sampling_params(stage, step=i // CHUNK), n=n))
            by_task: dict[str, list[Any]] = {}
            for e in result.experiences:
                by_task.setdefault(e.task_id, []).append(e)
            for task in chunk:
                samples = by_task.get(task.task_id, [])
                sampled += len(samples)
                pair = _pair(task, samples) if samples else None
                if pair is None:
                    right += bool(samples)
                else:
                    pairs.append(pair)
            progress.update(len(chunk))
    finally:
        progress.close()
    if not pairs:
        raise TrinityError(f"{where}.pairs_from_samples: the model answered every one of {len(tasks)} tasks right "
                           f"in all {n} samples: no pair to train on")
    summary = {"tasks": len(tasks), "samples": sampled, "pairs": len(pairs), "all_right": right,
               "skipped": len(tasks) - len(pairs) - right}
    out_dir.mkdir(parents=True, exist_ok=True)
    for target, text in ((path, "".join(json.dumps(p) + "\n" for p in pairs)),
                         (meta_path, json.dumps({"signature": signature, "summary": summary}, indent=1))):
        tmp = target.with_name(target.name + ".tmp")
        tmp.write_text(text)
        os.replace(tmp, target)  # the summary lands last: a half-built set is never reused
    return pair_config, summary


def _progress(cfg: Any, total: int, desc: str) -> Any:
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, unit="task", disable=not cfg.monitor.progress, leave=False)
