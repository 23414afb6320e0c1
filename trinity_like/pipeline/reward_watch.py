"""Watching a learned reward against the gold one (issue 22), in a stage whose rollouts get both.

Only when the workflow scores each answer with a gold reward beside the trained one
(:func:`~trinity_like.config.engine_params.gold_reward`), a :class:`RewardWatch` does two things:

- before the first step of a fresh run (``monitor.rm_check_tasks``), :meth:`RewardWatch.check_at_start`:
  the explorer's own workflow answers held-out tasks, and the AUCs of the learned reward
  against the gold one are logged at step 0 (``rm_check/*``) with a one-line summary -- the
  headline of ``trinity-like rm-check``, without its probes;
- on every explored batch, :meth:`RewardWatch.observe`: the gold reward falling while the
  learned one rises (:class:`~trinity_like.monitor.reward_hacking.RewardHackingGuard`) is a
  warning, and with ``monitor.stop_on_reward_hacking`` the best weights are kept and the run stops.

Example (the stage does this; ``keep`` saves the weights that sampled the batch, or is None)::

    watch = RewardWatch.for_stage(config, run_dir, model_path, "both", print)   # None: no gold reward
    metrics, line = watch.check_at_start(explorer, eval_tasks[:16])
    metrics = watch.observe(step, explore_metrics, [row.model_version for row in rows], keep=None)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trinity_like.config.engine_params import gold_reward, sampling_params
from trinity_like.config.schema import Config
from trinity_like.experience import Task
from trinity_like.monitor.reward_hacking import BEST_DIR, RewardHackingGuard, RewardHackingStop, learned_mean
from trinity_like.monitor.reward_stats import auc, fmt, grouped_auc

CHECK_SEED_STEP = 3_000_000  # the sampling seed's step of a reward check: draws differ from any training step's


@dataclass
class RewardWatch:
    """The gold-vs-learned checks of one stage (see the module doc)."""

    guard: RewardHackingGuard
    config: Config
    model_path: Path  # the starting model's folder: the best-by-gold folder copies its config and tokenizer
    write: Callable[[str], None]  # one line to the run's log

    @classmethod
    def for_stage(
        cls, config: Config, run_dir: Path, model_path: Path, role: str, write: Callable[[str], None]
    ) -> RewardWatch | None:
        """The watch of a stage whose rollouts get a gold reward (None otherwise); it stops a run
        only in mode ``both`` (an explorer process warns)."""
        if not gold_reward(config.explorer)[0]:
            return None
        m = config.monitor
        guard = RewardHackingGuard(
            m.reward_hacking_window, m.stop_on_reward_hacking and role == "both", run_dir / BEST_DIR
        )
        return cls(guard, config, model_path, write)

    def check_at_start(self, explorer: Any, tasks: list[Task]) -> tuple[dict[str, float], str]:
        """The explorer's workflow answers ``tasks`` ``group_size`` times, each answer scored by the
        trained reward and the gold one; returns the AUCs of the first against the second as
        ``rm_check/*`` metrics and a one-line summary (ending in a warning when the within-prompt
        AUC is within 0.1 of chance)."""
        config = self.config
        if not tasks:
            return {}, "reward check at start skipped (monitor.rm_check_tasks): the recipe has no buffer.eval_tasks"
        sampling = dataclasses.replace(sampling_params(config, step=CHECK_SEED_STEP), n=config.explorer.group_size)
        rows = [e for e in explorer.run(tasks, sampling).experiences if e.info.get("gold_reward") is not None]
        scores = [float(e.info.get("raw_reward", e.reward)) for e in rows]
        right = [float(e.info["gold_reward"]) >= 1.0 for e in rows]
        overall = auc(scores, right)
        within, n_groups = grouped_auc(scores, right, [e.task_id for e in rows])
        metrics = {
            "rm_check/samples": float(len(rows)),
            "rm_check/right_frac": sum(right) / max(len(rows), 1),
            "rm_check/prompts_with_both": float(n_groups),
        }
        metrics.update(
            {k: v for k, v in (("rm_check/auc", overall), ("rm_check/auc_within_prompt", within)) if v is not None}
        )
        line = (
            f"reward check at start ({len(tasks)} held-out tasks x {config.explorer.group_size}, gold right "
            f"{metrics['rm_check/right_frac']:.1%}): AUC {fmt(overall)}, within prompt {fmt(within)} "
            f"({n_groups} prompts)"
        )
        if within is not None and abs(within - 0.5) <= 0.1:
            line += " -- warning: within-prompt AUC near chance; see trinity-like rm-check"
        return metrics, line

    def observe(
        self, step: int, metrics: dict[str, float], versions: list[int], keep: Callable[[str], None] | None
    ) -> dict[str, float]:
        """Feed step ``step``'s explored batch (its metrics, the weight version of each row) to the guard;
        returns the metrics to log. ``keep(folder)`` writes the weights that sampled the batch, for
        the best-by-gold folder (None: the trainer no longer holds them). Raises
        :class:`~trinity_like.monitor.reward_hacking.RewardHackingStop` when the rule holds and stop is on."""
        learned = learned_mean(metrics)
        if "reward/gold_mean" not in metrics or learned is None or not versions:
            return {}
        guard = self.guard
        verdict = guard.observe(step, version=max(versions), gold=metrics["reward/gold_mean"], learned=learned)
        if guard.stop and verdict.new_best and keep is not None:
            guard.keep_best(keep, self.model_path)
        if verdict.diverging and not guard.warned:
            self.write(verdict.message)
        guard.warned = verdict.diverging
        if verdict.diverging and guard.stop:
            raise RewardHackingStop(guard.stop_message(verdict))
        return {"monitor/reward_hacking": float(verdict.diverging)}
