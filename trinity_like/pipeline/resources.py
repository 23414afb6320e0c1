"""What a stage holds besides its data: its train side (:class:`Trainer`), what it started on
this machine besides its engines (:class:`Resources`: Ray, the CPU board), and the memory its
processes hold (:func:`resident_bytes`)."""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass

import psutil

from trinity_like.cpu_share import TRAINER, CoreShare
from trinity_like.trainer.base import TrainEngine
from trinity_like.trainer.objective import Objective


@dataclass
class Trainer:
    """The train side of a stage: the actor and its loss; a reference and a critic where a component asks for them."""

    actor: TrainEngine
    objective: Objective  # the actor's loss (:mod:`~trinity_like.trainer.objective`)
    needs: frozenset[str]  # batch fields some component asks for (ref_logprob, old_logprob, values, ...)
    reference: TrainEngine | None = None  # reference logprobs (offline: only while a pair is not cached)
    critic: TrainEngine | None = None  # values, for algorithms with a critic
    value_objective: Objective | None = None  # the critic's loss

    def engines(self) -> list[TrainEngine]:
        return [e for e in (self.actor, self.reference, self.critic) if e is not None]

    def close(self) -> None:
        for engine in self.engines():
            engine.close()


@dataclass
class Resources:
    """What a stage started on this machine besides its engines, freed when it closes: Ray (if this
    stage started it) and the board through which the explorer actor and the trainer's workers
    share the CPU cores (:mod:`~trinity_like.cpu_share`)."""

    owns_ray: bool = False
    cores: CoreShare | None = None

    def trainer_computing(self) -> AbstractContextManager[None]:
        """Mark the trainer busy on the board for the body (the explorer then takes its share only)."""
        return self.cores.computing(TRAINER) if self.cores is not None else nullcontext()

    def close(self) -> None:
        if self.cores is not None:
            self.cores.close()
        if self.owns_ray:
            import ray

            ray.shutdown()


def resident_bytes(pids: list[int]) -> int:
    """Memory the processes ``pids`` of this machine hold, summed (gone or foreign ones: 0).

    Proportional set size where the OS reports it (Linux): a page shared by n processes
    counts 1/n in each, so weights in Ray's shared-memory object store, mapped by the
    trainer worker and the explorer alike, count once in the total. Elsewhere the resident
    set size, which counts them in each process.
    """
    total = 0
    for pid in pids:
        try:
            process = psutil.Process(pid)
            try:
                total += process.memory_full_info().pss
            except (AttributeError, psutil.AccessDenied):
                total += process.memory_info().rss
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass
    return total
