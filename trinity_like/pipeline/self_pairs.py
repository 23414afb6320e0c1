"""Preference pairs from the model's own mistakes (``pairs_from_samples`` on pair data).

For a DPO or reward-model stage whose ``buffer.train_data`` (or ``eval_data``) names
*tasks* (a generator or a task file) with ``pairs_from_samples: N``, the starting model
answers every task N times with the explorer's sampling, each answer is scored by the
evaluation reward (``explorer.eval_reward_fn``, else ``reward_fn``), and each task it gets
wrong at least once becomes one pair:

- ``prompt``: the task's chat messages;
- ``chosen``: the task's reference answer;
- ``rejected``: the model's most frequent wrong response (responses that ended on their
  own are preferred over ones cut at the token limit; ties go to the first sampled).

Wrong means less than the full reward (``reward < 1``; ``exact_match`` gives 0 or 1), and
a response whose text is the answer itself is never a rejected one. A task the model
always answers right gives no pair (``all_right`` in the summary), nor does one whose
reward failed (``skipped``).

**Pairs of every kind the policy produces** (:func:`kind_pairs`, written to files by
``trinity-like rm-pairs``): a reward model trained only on "right bare number vs a bare
near-miss" has never seen the free text a policy mostly samples, and one trained on "the
answer vs the commonest wrong sample" learns "number vs text" instead of "right vs wrong".
Pairs within one response format, and across formats in both directions, teach it the
difference that matters (formats: :func:`~trinity_like.monitor.reward_stats.response_format`).

The pairs are written once to ``<run_dir>/self_pairs/<name>.jsonl`` with a ``.json``
summary holding what they were built from (tasks, sample count, model, sampling, reward,
seed). A resumed run reads them back instead of sampling again, so it trains on the pairs
of the *starting* model, as the fresh run did. Settings that no longer match rebuild the
pairs when the run has no checkpoint yet, and are a one-line error when it has one.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from trinity_like.atomic import write_atomic
from trinity_like.config.engine_params import explorer_params, sampling_params
from trinity_like.config.schema import DatasetConfig
from trinity_like.errors import TrinityError
from trinity_like.explorer.worker import ExplorerWorker
from trinity_like.pipeline.data_sources import offline_rows

CHUNK = 32  # tasks per explorer call (progress and memory)
SEED_BASE = {"buffer.train_data": 1_000_000, "buffer.eval_data": 2_000_000}  # distinct draws per source


def _pair(task: Any, samples: list[Any]) -> dict[str, Any] | None:
    """The pair of one task from its sampled experiences, or None when every sample was right."""
    answer = str(task.answer).strip()
    wrong = [e for e in samples if (e.reward or 0.0) < 1.0 and e.info["response_text"].strip() != answer]
    if not wrong:
        return None
    finished = [e for e in wrong if e.finish_reason != "length"] or wrong
    texts = [e.info["response_text"].strip() for e in finished]
    rejected, _ = Counter(texts).most_common(1)[0]  # Counter keeps first-seen order among ties
    return {"prompt": task.messages(), "chosen": task.answer, "rejected": rejected}


# kind -> (format of chosen, format of rejected); each kind gives at most one pair per task
PAIR_KINDS = {
    "number": ("number", "number"),  # right vs wrong bare number
    "sentence": ("sentence", "sentence"),  # right vs wrong sentence
    "number_over_sentence": ("number", "sentence"),  # right bare number vs a wrong sentence
    "sentence_over_number": ("sentence", "number"),  # right sentence vs a wrong bare number
    "right_over_other": (None, "other"),  # any right response vs a wrong empty / cut-off / other one
}


def _commonest(samples: list[Any]) -> str | None:
    """The most frequent stripped text (ones that ended on their own first; ties: first sampled)."""
    if not samples:
        return None
    finished = [e for e in samples if e.finish_reason != "length"] or samples
    return Counter(e.info["response_text"].strip() for e in finished).most_common(1)[0][0]


def kind_pairs(task: Any, samples: list[Any], kinds: tuple[str, ...] = tuple(PAIR_KINDS)) -> list[dict[str, Any]]:
    """Pairs of one task from its samples labelled by the verifier (``reward >= 1``: right), one
    per kind of :data:`PAIR_KINDS` that the samples allow, each ``{"prompt", "chosen", "rejected",
    "kind"}``: the commonest right response of the chosen format vs the commonest wrong one of the
    rejected format. A right bare number no sample gave is the reference answer itself (when it
    is a bare number), as in :func:`_pair`; every other response is the policy's own."""
    from trinity_like.monitor.reward_stats import response_format

    right: dict[str | None, list[Any]] = {None: []}
    wrong: dict[str, list[Any]] = {}
    for e in samples:
        fmt = response_format(e.info["response_text"])
        if (e.reward or 0.0) >= 1.0:
            right.setdefault(fmt, []).append(e)
            right[None].append(e)
        else:
            wrong.setdefault(fmt, []).append(e)
    answer = str(task.answer).strip()
    pairs = []
    for kind in kinds:
        good_fmt, bad_fmt = PAIR_KINDS[kind]
        chosen = _commonest(right.get(good_fmt, []))
        if chosen is None and good_fmt == "number" and response_format(answer) == "number":
            chosen = answer
        rejected = _commonest(wrong.get(bad_fmt, []))
        if chosen is not None and rejected is not None and chosen != rejected:
            pairs.append({"prompt": task.messages(), "chosen": chosen, "rejected": rejected, "kind": kind})
    return pairs


def _signature(cfg: Any, source: DatasetConfig, tasks: list[Any]) -> dict[str, Any]:
    """What the pairs depend on (not the order options ``shuffle``/``seed``/``epochs``, applied when read)."""
    ex = cfg.explorer
    content = json.dumps([[t.messages(), t.answer] for t in tasks], sort_keys=True).encode()
    return {
        "tasks": hashlib.sha256(content).hexdigest(),
        "samples": source.pairs_from_samples,
        "model": cfg.model.path,
        "max_response_tokens": cfg.model.max_response_tokens,
        "sampling": ex.sampling.model_dump(mode="json"),
        "dtype": ex.dtype,
        "workflow": ex.workflow,
        "reward": [ex.eval_reward_fn, ex.eval_reward_args] if ex.eval_reward_fn else [ex.reward_fn, ex.reward_args],
        "seed": cfg.seed,
        "chunk": CHUNK,
    }


def build_self_pairs(
    stage: Any,
    source: DatasetConfig,
    where: str,
    tasks: list[Any],
    out_dir: Path,
    get_explorer: Callable[[], Any],
    *,
    resuming: bool,
) -> tuple[DatasetConfig, dict[str, Any], bool]:
    """The pairs of ``source``: read back from ``out_dir``, or sampled and written there.

    Returns the pair file as a data source, a summary (counts), and whether it was built now.
    ``get_explorer()`` gives an :class:`~trinity_like.pipeline.explorer_actor.ExplorerWorker`
    holding the starting weights; it is called only when the pairs are built. ``resuming``:
    the run has a checkpoint, so its pairs may not change.
    """
    cfg = stage.config
    name = where.rsplit(".", 1)[-1]
    path, meta_path = out_dir / f"{name}.jsonl", out_dir / f"{name}.json"
    signature = _signature(cfg, source, tasks)
    pair_config = DatasetConfig(path=str(path), shuffle=source.shuffle, seed=source.seed, epochs=source.epochs)
    if meta_path.exists() and path.exists():
        meta = json.loads(meta_path.read_text())
        if meta.get("signature") == signature:
            return pair_config, meta["summary"], False
        if resuming:
            changed = sorted(k for k in signature if meta.get("signature", {}).get(k) != signature[k])
            raise TrinityError(
                f"{where}.pairs_from_samples: {cfg.run_dir()} has checkpoints trained on pairs built "
                f"with other settings (changed: {', '.join(changed)}); use a new run name"
            )
    elif resuming:
        raise TrinityError(
            f"{where}.pairs_from_samples: {cfg.run_dir()} has checkpoints but its pairs "
            f"({path}) are gone; use a new run name"
        )
    pairs, summary = _sample_pairs(stage, source, where, tasks, get_explorer())
    out_dir.mkdir(parents=True, exist_ok=True)
    meta_path.unlink(missing_ok=True)  # no summary may vouch for a pair file being replaced
    write_atomic(path, "".join(json.dumps(p) + "\n" for p in pairs))
    write_atomic(meta_path, json.dumps({"signature": signature, "summary": summary}, indent=1))  # last: vouches
    return pair_config, summary, True


def _sample_pairs(
    stage: Any, source: DatasetConfig, where: str, tasks: list[Any], explorer: Any
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    from tqdm.auto import tqdm

    cfg = stage.config
    n = int(source.pairs_from_samples)
    pairs: list[dict[str, Any]] = []
    right = sampled = 0
    skipped: list[str] = []
    desc = f"{cfg.name}: pairs from samples ({where})"
    with tqdm(total=len(tasks), desc=desc, unit="task", disable=not cfg.monitor.progress, leave=False) as bar:
        for i in range(0, len(tasks), CHUNK):
            chunk = tasks[i : i + CHUNK]
            sampling = dataclasses.replace(sampling_params(cfg, step=SEED_BASE[where] + i // CHUNK), n=n)
            result = explorer.run(chunk, sampling, True)  # scored like evaluation: right or wrong
            skipped += [s.reason for s in result.skipped]
            by_task: dict[str, list[Any]] = {}
            for e in result.experiences:
                by_task.setdefault(e.task_id, []).append(e)
            for task in chunk:
                samples = by_task.get(task.task_id, [])
                sampled += len(samples)
                pair = _pair(task, samples) if samples else None
                if pair is not None:
                    pairs.append(pair)
                right += bool(samples) and pair is None
            bar.update(len(chunk))
    summary = {
        "tasks": len(tasks),
        "samples": sampled,
        "pairs": len(pairs),
        "all_right": right,
        "skipped": len(skipped),
    }
    if not pairs:
        why = f"; first reward failure: {skipped[0]}" if skipped else ""
        raise TrinityError(
            f"{where}.pairs_from_samples: no pair from {len(tasks)} tasks x {n} samples "
            f"({right} always answered right, {len(skipped)} skipped{why})"
        )
    return pairs, summary


def add_self_pairs(stage: Any) -> None:
    """Turn the stage's ``pairs_from_samples`` sources into pair rows (sampled once, by the starting
    model), and count them in ``stage.data.summary``. Runs before any train engine exists."""
    data, cfg = stage.data, stage.config
    explorer = functools.cache(lambda: ExplorerWorker(explorer_params(cfg), str(stage.model_path)))
    resuming = cfg.checkpoint.resume and stage.run.checkpoints.latest() is not None
    for key, tasks in data.pair_tasks.items():
        source = getattr(cfg.buffer, key)
        ds, summary, built = build_self_pairs(
            stage, source, f"buffer.{key}", tasks, stage.run_dir / "self_pairs", explorer, resuming=resuming
        )
        if built:  # cached reference logprobs are keyed by pair-file line: stale for new pairs
            (stage.run_dir / "ref_cache.safetensors").unlink(missing_ok=True)
        rows = offline_rows(stage.spec, key, ds, stage.tokenizer)
        if key == "train_data":
            data.train = rows
        else:
            data.eval_rows = list(rows)
        data.summary.update({f"self_pairs/{key}/{k}": float(v) for k, v in summary.items()})
    if data.eval_tasks and explorer.cache_info().currsize:
        stage.explorer = explorer()  # the starting model's engine answers the held-out tasks too
