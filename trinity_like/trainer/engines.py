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
"""

from __future__ import annotations

from dataclasses import dataclass

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


def build_train_engine(name: str, spec: TrainEngineSpec) -> TrainEngine:
    """The ``TRAIN_ENGINE`` entry ``name`` built from ``spec``."""
    factory = TRAIN_ENGINE.get(name)  # an unknown name fails first, listing the known ones
    engine = factory(spec)
    if not isinstance(engine, TrainEngine):
        raise TypeError(f"train engine {name!r} built a {type(engine).__name__}, which lacks the TrainEngine members")
    return engine


@TRAIN_ENGINE.register_module("local")
def local_engine(spec: TrainEngineSpec) -> TrainEngine:
    """In-process torch: one process, the model on the run's device (quick prototypes, the client, tests)."""
    from trinity_like.trainer.local_engine import LocalEngine

    return LocalEngine(spec.model, spec.optim)


@TRAIN_ENGINE.register_module("verl")
def verl_engine(spec: TrainEngineSpec) -> TrainEngine:
    """verl's FSDP workers through Ray: nccl on GPUs, gloo on CPUs."""
    from trinity_like.trainer.verl_engine import VerlEngine

    return VerlEngine(spec.model, spec.optim, spec.cluster)
