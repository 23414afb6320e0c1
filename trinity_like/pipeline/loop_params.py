"""What the loops read of a recipe: :class:`LoopParams`, built once per stage by :meth:`LoopParams.of`.

The loops (:mod:`.rl_loop`, :mod:`.async_loop`, :mod:`.offline_loop`, :mod:`.explorer_process`,
:mod:`.steps`) never read the recipe itself (``tests/core/test_layering.py``): a stage hands
them these values as :attr:`.verbs.StageVerbs.params`, as the engines take their own params
objects (:mod:`trinity_like.config.engine_params`). Example::

    params = LoopParams.of(spec)          # spec: a ResolvedStage of a loaded plan
    while loop.step < params.total_steps:
        ...
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from trinity_like.components import ComponentSpec

if TYPE_CHECKING:
    from trinity_like.config import ResolvedStage


@dataclass(frozen=True)
class LoopParams:
    """Every value of the recipe that a loop reads, each under the key it comes from."""

    total_steps: int  # trainer.total_steps: the step the loop ends after
    update_epochs: int  # trainer.update_epochs: optimiser steps over each batch
    max_nan_steps: int  # trainer.max_nan_steps: non-finite losses in a row before the run stops
    train_batch_size: int  # buffer.train_batch_size, else everything one explore step writes (offline: rows per step)
    pairs: bool  # the algorithm's data schema is "pair" (DPO, RM): rows are (chosen, rejected) pairs
    use_rollout: bool  # the algorithm samples with an explorer (online): weights are synced to it
    dynamic_sampling: bool  # drop groups of equal rewards before the update (the recipe's choice, else the algorithm's)
    kl_penalty: ComponentSpec | None  # slot kl_penalty: KL shaping of the rewards before advantages (None: off)
    advantage: ComponentSpec | None  # slot advantage: the advantage fn (None: the batch keeps no advantages)
    sync_offset: int  # synchronizer.offset: batches the explorer may run ahead of the trainer
    sync_interval: int  # synchronizer.interval: weights go to the explorer every this many steps
    sync_newest_first: bool  # synchronizer.sync_style == "explorer_driven": the explorer loads the newest weights
    sync_at_end: bool  # mode == "train": the last step's weights go to the explorer process, which evaluates them
    gap_max_kl_k3: float | None  # trainer.sampler_gap.max_kl_k3: the sampler-trainer gap's bound (None: none)
    gap_stop: bool  # trainer.sampler_gap.action == "stop": past the bound the run stops (else it warns)
    eval_interval: int  # monitor.eval_interval: evaluate every this many steps, start and end aside (0, unset: never)
    eval_at_start: bool  # monitor.eval_at_start: evaluate before the first step of a fresh run
    rm_check_tasks: int  # monitor.rm_check_tasks: held-out tasks to check the learned reward on at step 0 (0: off)
    checkpoint_interval: int  # checkpoint.interval: save every this many steps (and at the last)
    resume: bool  # checkpoint.resume: continue from what the run directory holds

    @classmethod
    def of(cls, spec: ResolvedStage) -> LoopParams:
        """The loops' values of the resolved stage ``spec``: the one place they are read from the recipe."""
        cfg = spec.config
        t, sync, monitor = cfg.trainer, cfg.synchronizer, cfg.monitor
        return cls(
            total_steps=t.total_steps,
            update_epochs=t.update_epochs,
            max_nan_steps=t.max_nan_steps,
            train_batch_size=spec.train_batch_size,
            pairs=spec.algorithm.schema == "pair",
            use_rollout=spec.algorithm.use_rollout,
            dynamic_sampling=spec.dynamic_sampling,
            kl_penalty=spec.components.get("kl_penalty"),
            advantage=spec.components.get("advantage"),
            sync_offset=sync.offset,
            sync_interval=sync.interval,
            sync_newest_first=sync.sync_style == "explorer_driven",
            sync_at_end=cfg.mode == "train",
            gap_max_kl_k3=t.sampler_gap.max_kl_k3,
            gap_stop=t.sampler_gap.action == "stop",
            eval_interval=monitor.eval_interval or 0,
            eval_at_start=monitor.eval_at_start,
            rm_check_tasks=monitor.rm_check_tasks,
            checkpoint_interval=cfg.checkpoint.interval,
            resume=cfg.checkpoint.resume,
        )
