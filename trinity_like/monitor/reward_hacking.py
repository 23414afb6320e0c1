"""The divergence rule: the gold reward falling while the learned reward rises.

Over-optimising a learned reward shows as the two curves parting: the reward the policy is
trained on keeps rising while the task's verifier (``reward/gold_mean``, see
:mod:`trinity_like.explorer.workflows`) falls. :class:`RewardHackingGuard` watches each
explored batch (``monitor.reward_hacking_window`` K):

    over the last K + 1 steps, the least-squares slope of the gold mean is negative, the
    slope of the learned mean is positive, and the gold mean ends below where it started.

It then writes one warning line (once per episode: again only after the rule has stopped
holding) and logs ``monitor/reward_hacking`` = 1. With ``monitor.stop_on_reward_hacking``
it also keeps the best-by-gold weights -- the weights whose rollouts had the highest
``reward/gold_mean`` so far -- in ``<run_dir>/best_gold`` (a Hugging Face folder, with
``best_gold.json`` saying which step), and on divergence stops the run with one line
naming that step (:class:`RewardHackingStop`). The weights can be kept only when the
rollouts were sampled by the trainer's current weights (``synchronizer.offset: 0``).

Example::

    guard = RewardHackingGuard(window=2, stop=False)
    for step, (gold, learned) in enumerate([(0.5, 1.0), (0.4, 1.2), (0.3, 1.5)], start=1):
        verdict = guard.observe(step, version=step - 1, gold=gold, learned=learned)
    verdict.diverging   # True: gold fell over the last 2 steps while the learned reward rose
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trinity_like.errors import TrinityError

BEST_DIR = "best_gold"
BEST_FILE = "best_gold.json"


class RewardHackingStop(TrinityError):
    """The run stopped because the gold reward fell while the learned one rose."""


def slope(values: list[float]) -> float:
    """Least-squares slope of ``values`` against 0, 1, 2, ...

    >>> slope([1.0, 2.0, 3.0]), slope([3.0, 1.0, 2.0])
    (1.0, -0.5)
    """
    n = len(values)
    mx, my = (n - 1) / 2, sum(values) / n
    sxx = sum((i - mx) ** 2 for i in range(n))
    return sum((i - mx) * (v - my) for i, v in enumerate(values)) / sxx


@dataclass(frozen=True)
class Verdict:
    """What one observation means."""

    new_best: bool  # the highest gold mean so far
    diverging: bool  # the rule holds now
    message: str  # the warning line ("" when not diverging)


class RewardHackingGuard:
    """Watches (gold, learned) per step; see the module doc."""

    def __init__(self, window: int, stop: bool, best_dir: Path | None = None) -> None:
        self.window = window
        self.stop = stop
        self.best_dir = best_dir
        self.history: list[tuple[int, float, float]] = []  # (step, gold, learned)
        self.best: dict[str, Any] | None = None  # {"step", "version", "gold_mean", "learned_mean"}
        self.warned = False
        if best_dir is not None and (best_dir / BEST_FILE).is_file():  # a resumed run keeps its best
            self.best = json.loads((best_dir / BEST_FILE).read_text())

    def observe(self, step: int, *, version: int, gold: float, learned: float) -> Verdict:
        """Record step ``step``'s batch, sampled by the weights of step ``version``."""
        self.history.append((step, gold, learned))
        new_best = self.best is None or gold > self.best["gold_mean"]
        if new_best:
            self.best = {"step": step, "version": version, "gold_mean": gold, "learned_mean": learned, "kept": False}
        recent = self.history[-(self.window + 1) :]
        diverging = False
        if len(recent) == self.window + 1:
            golds, learns = [g for _, g, _ in recent], [r for _, _, r in recent]
            diverging = slope(golds) < 0 < slope(learns) and golds[-1] < golds[0]
        message = ""
        if diverging:
            (s0, g0, l0), (_, g1, l1) = recent[0], recent[-1]
            message = (
                f"step {step}: reward hacking? the gold reward fell over the last {self.window} steps "
                f"({g0:.3g} at step {s0} -> {g1:.3g}) while the learned reward rose ({l0:.3g} -> {l1:.3g})"
            )
        return Verdict(new_best, diverging, message)

    def keep_best(self, save_weights: Callable[[str], None], model_folder: Path) -> None:
        """Write the current weights as the best-by-gold folder (``save_weights(folder)`` writes
        ``model.safetensors``; config and tokenizer files are copied from ``model_folder``)."""
        target = self.best_dir
        tmp = target.with_name(f".{target.name}.tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        save_weights(str(tmp))
        for f in model_folder.iterdir():
            if (
                f.is_file()
                and not f.name.endswith((".safetensors", ".bin", ".pt"))
                and f.name != "model.safetensors.index.json"
            ):
                shutil.copy2(f, tmp / f.name)
        self.best["kept"] = True
        (tmp / BEST_FILE).write_text(json.dumps(self.best, indent=1))
        shutil.rmtree(target, ignore_errors=True)
        tmp.rename(target)

    def stop_message(self, verdict: Verdict) -> str:
        if self.best is not None and self.best.get("kept"):
            best = (
                f"best-by-gold weights: those after step {self.best['version']} (gold_mean "
                f"{self.best['gold_mean']:.3g} on step {self.best['step']}'s rollouts), kept in {self.best_dir}"
            )
        else:
            best = "no best-by-gold weights could be kept (they are kept only with synchronizer.offset: 0)"
        return f"{verdict.message}; stopped (monitor.stop_on_reward_hacking); {best}"


def learned_mean(metrics: dict[str, float]) -> float | None:
    """The learned reward's batch mean before any batch transform (``reward/raw_mean``, else
    ``reward/mean``): a z-scored reward's mean is 0 at every step and could never rise.

    >>> learned_mean({"reward/mean": 0.0, "reward/raw_mean": 2.5}), learned_mean({"reward/mean": 1.5})
    (2.5, 1.5)
    """
    return metrics.get("reward/raw_mean", metrics.get("reward/mean"))
