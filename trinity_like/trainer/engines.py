"""The one train-engine factory: a ``TRAIN_ENGINE`` entry over a :class:`TrainEngineSpec`.

Example::

    spec = TrainEngineSpec(ModelParams(path="/path/to/hf_folder"), OptimParams(lr=1e-4))
    actor = build_train_engine("local", spec)

Every engine is an entry of the ``TRAIN_ENGINE`` registry (``trinity-like list train_engine``):
a callable that takes a :class:`TrainEngineSpec` and returns a
:class:`~trinity_like.trainer.base.TrainEngine`. Ours are registered below through the same
public decorator a plugin uses: ``local`` is an in-process torch engine; ``verl`` starts
verl's FSDP workers through Ray (:attr:`TrainEngineSpec.cluster`). verl and Ray are imported
only when the ``verl`` engine is built, so the ``local`` one starts without them. A recipe's
``trainer.engine`` is built by :func:`trinity_like.config.engine_params.build_engine`.

What the rest of the core must know of an engine before or beside building it (does it run
its workers through Ray, set their threads itself, take extra memory, score any target
tokens) is declared beside its registration as :class:`TrainEngineTraits`
(:func:`declare_traits`) and read by :func:`train_engine_traits`: the core never branches on
an engine's name, so a plugin's engine gets the same treatment as ours::

    @TRAIN_ENGINE.register_module("my_workers")
    @declare_traits(TrainEngineTraits(ray_workers=True, own_threads=True, extra_memory_gb=1.0))
    def my_workers(spec: TrainEngineSpec) -> TrainEngine: ...
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from trinity_like.registry import TRAIN_ENGINE
from trinity_like.trainer.base import TrainEngine
from trinity_like.trainer.params import ModelParams, OptimParams
from trinity_like.trainer.verl_config import VerlParams


@dataclass(frozen=True)
class TrainEngineSpec:
    """What a registered train-engine factory builds an engine from."""

    model: ModelParams  # the model folder, its kind and how it runs
    optim: OptimParams = OptimParams()  # the optimiser and its schedule
    cluster: VerlParams = VerlParams()  # where an engine's workers run (the `verl` engine's; in-process ones ignore it)


@dataclass(frozen=True)
class TrainEngineTraits:
    """What the core asks of a train engine instead of its name (an entry that declares none: these defaults)."""

    # Its workers are Ray actors, processes of their own: a run starts (or joins) Ray for them
    # with a logical CPU per worker, counts the GPUs they ask for (cluster.num_gpus) before it
    # starts, lets them share the cores with an explorer that explores beside them
    # (CpuThreads.shared), and with explorer.placement auto puts the explorer in a Ray actor
    # beside them. The client's ray backend cannot host it inside its learner actor.
    ray_workers: bool = False
    own_threads: bool = False  # its workers set their thread count from cluster.trainer_threads, not OMP_NUM_THREADS
    extra_memory_gb: float = 0.0  # resident memory beyond the model's copies (a Ray head, worker processes)
    exact_targets: bool = False  # it scores a client's target_ids as given (else they must be the next tokens)
    plan_text: str = ""  # how the run plan names it: its workers (after their count) or, in-process, where it runs


F = TypeVar("F", bound=Callable[..., Any])


def declare_traits(traits: TrainEngineTraits) -> Callable[[F], F]:
    """Declare ``traits`` on a train-engine factory: stack it under ``@TRAIN_ENGINE.register_module``
    (a factory class may hold a ``traits`` class attribute instead)."""

    def mark(factory: F) -> F:
        factory.traits = traits  # type: ignore[attr-defined]
        return factory

    return mark


def train_engine_traits(name: str) -> TrainEngineTraits:
    """The traits the ``TRAIN_ENGINE`` entry ``name`` declares; an unknown name fails listing the known ones."""
    traits = getattr(TRAIN_ENGINE.get(name), "traits", TrainEngineTraits())
    if not isinstance(traits, TrainEngineTraits):
        raise TypeError(f"train engine {name!r} declares traits of type {type(traits).__name__}, not TrainEngineTraits")
    return traits


def build_train_engine(name: str, spec: TrainEngineSpec) -> TrainEngine:
    """The ``TRAIN_ENGINE`` entry ``name`` built from ``spec``."""
    factory = TRAIN_ENGINE.get(name)  # an unknown name fails first, listing the known ones
    engine = factory(spec)
    if not isinstance(engine, TrainEngine):
        raise TypeError(f"train engine {name!r} built a {type(engine).__name__}, which lacks the TrainEngine members")
    return engine


@TRAIN_ENGINE.register_module("local")
@declare_traits(
    TrainEngineTraits(exact_targets=True, plan_text="in-process torch in this process; no Ray, no verl workers")
)
def local_engine(spec: TrainEngineSpec) -> TrainEngine:
    """In-process torch: one process, the model on the run's device (quick prototypes, the client, tests)."""
    from trinity_like.trainer.local_engine import LocalEngine

    return LocalEngine(spec.model, spec.optim)


@TRAIN_ENGINE.register_module("verl")
@declare_traits(TrainEngineTraits(ray_workers=True, own_threads=True, extra_memory_gb=1.0, plan_text="FSDP worker(s)"))
def verl_engine(spec: TrainEngineSpec) -> TrainEngine:
    """verl's FSDP workers through Ray: nccl on GPUs, gloo on CPUs."""
    from trinity_like.trainer.verl_engine import VerlEngine

    return VerlEngine(spec.model, spec.optim, spec.cluster)
