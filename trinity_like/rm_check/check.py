"""``trinity-like rm-check``: a reward model judged on the samples RL will train it on.

Before RL on a learned reward, sample the policy RL starts from (the recipe's model, with
the recipe's rollout sampling) on held-out tasks, score every sample with the reward model
and with the task's rule-based verifier (the recipe's ``explorer.eval_reward_fn``, else its
``reward_fn``), and report how well the two agree (:mod:`trinity_like.monitor.reward_stats`, :mod:`.probes`):

- AUC of the RM score against the verifier's right/wrong, overall, within each response
  format, and within groups of the same prompt (the comparison GRPO makes);
- the RM's preference rate on hand-made probes (right vs off-by-one, vs empty, ...);
- Spearman and Pearson correlation of score and response length (tokens).

A within-group AUC within ``warn_margin`` of 0.5 is a warning: RL on this reward model
would push the policy in directions unrelated to being right.

Example::

    setup = check_setup("examples/grpo_with_rm.yaml", num_tasks=64)
    report = run_check(setup, build_reward_fn("reward_model", {"path": "runs/rm"}), "runs/rm", samples=8)
    print(format_report(report))
"""

from __future__ import annotations

import dataclasses
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trinity_like.config.schema import Config, DatasetConfig
from trinity_like.errors import TrinityError
from trinity_like.experience import Task
from trinity_like.explorer.rewards import RewardCall
from trinity_like.monitor.reward_stats import (
    FORMATS,
    auc,
    fmt,
    grouped_auc,
    pearson,
    response_format,
    spearman,
)
from trinity_like.pipeline.reward_watch import CHECK_SEED_STEP
from trinity_like.rm_check.probes import probe_pairs

RECIPE_SUFFIXES = (".yaml", ".yml", ".toml")
TRANSFORM_KEYS = ("reward_transform", "reward_transform_args")  # workflow args that rewrite a batch's rewards


@dataclass(frozen=True)
class CheckSetup:
    """What the check samples and how it judges: the RL stage's config, the held-out tasks."""

    config: Config  # the RL stage (model, rollout sampling); its reward is replaced by the verifier
    tasks: list[Task]  # held-out tasks
    verifier: str  # REWARD_FN name of the rule-based verifier
    verifier_args: dict[str, Any]  # its params
    source: str  # where the tasks came from (for the report)


def check_setup(
    tasks: str,
    *,
    num_tasks: int,
    model: str | None = None,
    verifier: str | None = None,
    plugins: list[str] | None = None,
    key: str = "eval_tasks",
    overrides: list[str] | None = None,
) -> CheckSetup:
    """The check's setup from a recipe (its first RL stage: model, sampling, ``buffer.<key>``
    and verifier) or from a task file (JSONL/parquet with ``prompt``/``answer``; default model and
    sampling, verifier ``exact_match``). ``model``/``verifier`` override either; ``overrides``
    (``key.path=value``) apply to a recipe."""
    from trinity_like.pipeline.data_sources import task_set

    if Path(tasks).suffix in RECIPE_SUFFIXES:
        from trinity_like.config import load_plan

        stages = [s for s in load_plan(tasks, list(overrides or []), plugins).stages if s.algorithm.use_rollout]
        if not stages:
            raise TrinityError(f"{tasks}: no stage samples from a policy (no RL stage) to check a reward model against")
        cfg = stages[0].config
        source, where = getattr(cfg.buffer, key), f"{tasks}: buffer.{key}"
        if source is None:
            raise TrinityError(f"{where} is not set")
        name = verifier or cfg.explorer.eval_reward_fn or cfg.explorer.reward_fn
        args = cfg.explorer.eval_reward_args if (verifier is None and cfg.explorer.eval_reward_fn) else {}
    else:
        if overrides:
            raise TrinityError(f"{tasks}: key=value overrides apply to a recipe, not to a task file")
        if not Path(tasks).exists():
            raise TrinityError(f"--tasks {tasks}: no such file (a recipe .yaml/.toml or a task file)")
        cfg, source, where = Config(), DatasetConfig(path=tasks, shuffle=False), f"--tasks {tasks}"
        name, args = verifier or "exact_match", {}
    if model is not None:
        cfg = cfg.model_copy(update={"model": cfg.model.model_copy(update={"path": model})})
    rows = list(task_set(source, where, train=False))[:num_tasks]
    if not rows:
        raise TrinityError(f"{where}: no tasks")
    return CheckSetup(cfg, rows, name, dict(args), tasks)


def sample_policy(setup: CheckSetup, samples: int, seed_step: int = CHECK_SEED_STEP) -> list[tuple[Task, Any]]:
    """``samples`` responses per task from the starting policy, scored by the verifier:
    (task, experience) pairs; the experience's ``reward`` is the verifier's."""
    from trinity_like.config.engine_params import explorer_params, sampling_params
    from trinity_like.explorer.worker import ExplorerWorker
    from trinity_like.models.resolve import resolve_model_path

    cfg = setup.config
    # The workflow scores with the verifier alone: no gold reward beside it, no batch transform of it.
    workflow_args = {k: v for k, v in cfg.explorer.workflow_args.items() if k not in TRANSFORM_KEYS}
    explorer_cfg = cfg.explorer.model_copy(
        update={
            "reward_fn": setup.verifier,
            "reward_args": setup.verifier_args,
            "eval_reward_fn": None,
            "eval_reward_args": {},
            "gold_reward_fn": "",
            "workflow_args": workflow_args,
        }
    )
    cfg = cfg.model_copy(update={"explorer": explorer_cfg})
    worker = ExplorerWorker(explorer_params(cfg), str(resolve_model_path(cfg.model.path)))
    try:
        sampling = dataclasses.replace(sampling_params(cfg, step=seed_step), n=samples)
        result = worker.run(setup.tasks, sampling)
    finally:
        worker.close()
    by_id = {t.task_id: t for t in setup.tasks}
    if result.skipped:
        raise TrinityError(
            f"verifier {setup.verifier}: failed on task {result.skipped[0].task_id} ({result.skipped[0].reason})"
        )
    return [(by_id[e.task_id], e) for e in result.experiences]


def _score(scorer: RewardCall, task: Task, response: str) -> float:
    return scorer({"response": response, "answer": task.answer, "task": task, "messages": task.messages()})


def _rate(wins: list[float]) -> dict[str, Any]:
    return {"rate": statistics.fmean(wins) if wins else None, "n": len(wins)}


def run_check(
    setup: CheckSetup, scorer: RewardCall, scorer_name: str, *, samples: int, warn_margin: float = 0.1
) -> dict[str, Any]:
    """Sample, score and measure; returns the report (what the JSON file holds)."""
    sampled = sample_policy(setup, samples)
    scores, right, groups, lengths, formats, rows = [], [], [], [], [], []
    for task, e in sampled:
        text = e.info["response_text"]
        score = _score(scorer, task, text)
        fmt = response_format(text)
        scores.append(score)
        right.append(float(e.reward or 0.0) >= 1.0)
        groups.append(task.task_id)
        lengths.append(float(e.response_length))
        formats.append(fmt)
        rows.append(
            {
                "task_id": task.task_id,
                "response": text,
                "format": fmt,
                "right": right[-1],
                "score": score,
                "length": e.response_length,
            }
        )
    by_format = {}
    for fmt in FORMATS:
        idx = [i for i, f in enumerate(formats) if f == fmt]
        by_format[fmt] = {
            "share": len(idx) / len(formats) if formats else 0.0,
            "right": sum(right[i] for i in idx),
            "n": len(idx),
            "auc": auc([scores[i] for i in idx], [right[i] for i in idx]),
            "score_mean": statistics.fmean(scores[i] for i in idx) if idx else None,
        }
    within, n_groups = grouped_auc(scores, right, groups)
    probes: dict[str, list[float]] = {}
    for task in setup.tasks:
        pairs = probe_pairs(task.answer)
        for name, (first, second) in (pairs or {}).items():
            a, b = _score(scorer, task, first), _score(scorer, task, second)
            probes.setdefault(name, []).append(1.0 if a > b else 0.5 if a == b else 0.0)
    report = {
        "scorer": scorer_name,
        "policy": setup.config.model.path,
        "tasks_from": setup.source,
        "verifier": setup.verifier,
        "tasks": len(setup.tasks),
        "samples_per_task": samples,
        "samples": len(scores),
        "right_frac": sum(right) / len(right) if right else 0.0,
        "auc": {
            "overall": auc(scores, right),
            "within_group": within,
            "groups_with_both": n_groups,
            "by_format": by_format,
        },
        "probes": {name: _rate(wins) for name, wins in probes.items()},
        "length": {"spearman": spearman(scores, lengths), "pearson": pearson(scores, lengths)},
        "warnings": [],
        "rows": rows,
    }
    if within is None:
        report["warnings"].append("within-group AUC: no prompt has both right and wrong samples (more --samples?)")
    elif abs(within - 0.5) <= warn_margin:
        report["warnings"].append(
            f"within-group AUC {within:.3f} is within {warn_margin} of chance (0.5): "
            f"GRPO on this reward model ranks a prompt's samples no better than a coin"
        )
    return report


def format_report(report: dict[str, Any]) -> str:
    """The terminal table of a report."""
    a = report["auc"]
    lines = [
        (
            f"reward model {report['scorer']} on {report['policy']}'s samples ({report['tasks']} tasks x "
            f"{report['samples_per_task']}, verifier {report['verifier']}, right {report['right_frac']:.1%})"
        ),
        f"  AUC overall        {fmt(a['overall'])}",
        f"  AUC within prompt  {fmt(a['within_group'])}   ({a['groups_with_both']} prompts with right and wrong samples)",
        "  by format          share   right      n    AUC   mean score",
    ]
    for form, row in a["by_format"].items():
        lines.append(
            f"    {form:<16} {row['share']:6.1%} {row['right']:7d} {row['n']:6d} {fmt(row['auc']):>6}   "
            f"{fmt(row['score_mean'])}"
        )
    lines.append("  probes (first preferred)            rate     n")
    for name, row in report["probes"].items():
        lines.append(f"    {name:<34} {fmt(row['rate']):>5} {row['n']:5d}")
    length = report["length"]
    lines.append(f"  score vs length    spearman {fmt(length['spearman'])}, pearson {fmt(length['pearson'])}")
    lines += [f"warning: {w}" for w in report["warnings"]]
    return "\n".join(lines)
