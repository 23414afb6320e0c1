"""Train engines by name: ``verl`` (the default, verl's FSDP workers through Ray) or ``local``.

Example::

    engine = build_engine("local", ModelParams(path="tiny"), OptimParams(lr=1e-5))
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from trinity_like.errors import TrinityError
from trinity_like.trainer.base import TrainEngine
from trinity_like.trainer.params import ModelParams, OptimParams

if TYPE_CHECKING:
    from trinity_like.trainer.verl_engine import VerlParams

ENGINES = ("verl", "local")


def build_engine(name: str, model: ModelParams, optim: OptimParams, verl: VerlParams | None = None) -> TrainEngine:
    """Start the named engine; ``verl`` (workers, Ray address) applies to the ``verl`` engine only.

    verl, Ray and the CPU registration are imported only when the ``verl`` engine is asked
    for, so the ``local`` engine starts without them.
    """
    if name == "local":
        from trinity_like.trainer.local_engine import LocalEngine

        return LocalEngine(model, optim)
    if name == "verl":
        from trinity_like.trainer.verl_engine import VerlEngine, VerlParams

        return VerlEngine(model, optim, verl if verl is not None else VerlParams())
    raise TrinityError(f"train engine {name!r} unknown; expected one of {', '.join(ENGINES)}")
