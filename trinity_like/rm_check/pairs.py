"""``trinity-like rm-pairs``: preference-pair files drawn from the starting policy's own samples.

The policy RL will start from (a recipe's first RL stage: model, rollout sampling, verifier)
answers the recipe's training tasks and its held-out tasks N times each; the verifier labels
every answer right or wrong, and :func:`~trinity_like.pipeline.self_pairs.kind_pairs` turns
each task's answers into pairs within a format and across formats. Two files and a summary::

    <out>/pairs.jsonl        from buffer.tasks       (a reward model's buffer.train_data)
    <out>/pairs_eval.jsonl   from buffer.eval_tasks  (its buffer.eval_data: the same kinds, held out)
    <out>/pairs.json         counts per kind and split, and what the pairs were drawn with

Each line is ``{"prompt": [messages], "chosen": ..., "rejected": ..., "kind": ...}``.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

from trinity_like.atomic import write_atomic
from trinity_like.errors import TrinityError
from trinity_like.pipeline.self_pairs import PAIR_KINDS, kind_pairs
from trinity_like.rm_check.check import check_setup, sample_policy

SEED_STEP = {"tasks": 4_000_000, "eval_tasks": 5_000_000}  # sampling seeds apart from training and rm-check


def write_policy_pairs(
    recipe: str,
    out_dir: str | Path,
    *,
    samples: int,
    num_tasks: int,
    num_eval_tasks: int,
    model: str | None = None,
    plugins: list[str] | None = None,
    overrides: list[str] | None = None,
) -> dict[str, Any]:
    """Sample, label and pair (see the module doc); returns the summary written to ``pairs.json``.
    ``overrides`` (``key.path=value``) apply to the recipe, as on ``trinity-like run``."""
    out = Path(out_dir)
    files = {"tasks": out / "pairs.jsonl", "eval_tasks": out / "pairs_eval.jsonl"}
    summary: dict[str, Any] = {
        "recipe": recipe,
        "overrides": list(overrides or []),
        "samples_per_task": samples,
        "kinds": list(PAIR_KINDS),
    }
    written: dict[str, list[dict[str, Any]]] = {}
    for key, count in (("tasks", num_tasks), ("eval_tasks", num_eval_tasks)):
        setup = check_setup(recipe, num_tasks=count, model=model, plugins=plugins, key=key, overrides=overrides)
        by_task: dict[str, list[Any]] = {}
        for task, e in sample_policy(setup, samples, seed_step=SEED_STEP[key]):
            by_task.setdefault(task.task_id, []).append(e)
        pairs = [p for t in setup.tasks for p in kind_pairs(t, by_task.get(t.task_id, []))]
        if not pairs:
            raise TrinityError(
                f"{recipe}: buffer.{key}: no pair from {len(setup.tasks)} tasks x {samples} samples "
                f"(every answer right, or every one wrong with no reference to pair it with?)"
            )
        summary.update(model=setup.config.model.path, verifier=setup.verifier)
        right = sum(float(e.reward or 0.0) >= 1.0 for group in by_task.values() for e in group)
        summary[key] = {
            "tasks": len(setup.tasks),
            "samples": sum(len(g) for g in by_task.values()),
            "right": right,
            "pairs": len(pairs),
            "by_kind": dict(Counter(p["kind"] for p in pairs)),
        }
        written[key] = pairs
    out.mkdir(parents=True, exist_ok=True)
    for key, pairs in written.items():
        write_atomic(files[key], "".join(json.dumps(p) + "\n" for p in pairs))
    write_atomic(out / "pairs.json", json.dumps(summary, indent=1))
    return summary
