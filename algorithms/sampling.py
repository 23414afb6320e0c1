"""Sample strategies (SAMPLE_STRATEGY): which experiences make up the next training batch.

Each implements the protocol of ``trinity_like.buffer.base``: it claims rows from an
``ExperienceSource`` (and, for MIX, takes rows from an ``ExpertSource``). A strategy
declares ``uses_expert_data``: True when ``sample`` needs an ``expert`` source, which the
pipeline then builds from ``buffer.expert_data``::

    strategy = SAMPLE_STRATEGY.get("staleness")(params=StalenessParams(max_staleness=1))
    batch = strategy.sample(experiences=storage, batch_size=64, model_version=7)

Rows are claimed, not consumed: the storage marks them consumed when the training step
that used them is committed.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Literal

from trinity_like.buffer.base import ExperienceSource, ExpertSource
from trinity_like.experience import Experience
from trinity_like.registry import SAMPLE_STRATEGY

Order = Literal["fifo", "newest_version"]  # trinity_like.buffer.base.ORDERS


@dataclass(frozen=True)
class DefaultParams:
    order: Order = "fifo"  # "fifo": oldest written first; "newest_version": freshest weights first
    timeout: float | None = None  # seconds to wait for a full batch; None waits until it is there


@SAMPLE_STRATEGY.register_module("default")
class DefaultStrategy:
    """Claim the next batch in write order (or freshest first)."""

    uses_expert_data = False  # needs no ExpertSource (see MixStrategy)

    def __init__(self, *, params: DefaultParams) -> None:
        self.params = params

    def sample(
        self, *, experiences: ExperienceSource, batch_size: int, model_version: int, expert: ExpertSource | None = None
    ) -> list[Experience]:
        return experiences.claim(batch_size, order=self.params.order, timeout=self.params.timeout)

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass


@dataclass(frozen=True)
class MixSampleParams(DefaultParams):
    expert_ratio: float = 0.5  # r: expert share of the batch, added on top of the rollouts (round(B r / (1 - r)) rows)

    def __post_init__(self) -> None:
        if not 0.0 <= self.expert_ratio < 1.0:
            raise ValueError(
                f"expert_ratio must be in [0, 1) (expert rows come on top of the rollouts), got {self.expert_ratio}"
            )


def expert_rows_for(batch_size: int, expert_ratio: float) -> int:
    """Expert rows to add to ``batch_size`` rollout rows so they are ``expert_ratio`` of the whole.

    >>> expert_rows_for(64, 0.25), expert_rows_for(64, 0.5), expert_rows_for(64, 0.0)
    (21, 64, 0)
    """
    return round(batch_size * expert_ratio / (1.0 - expert_ratio))


@SAMPLE_STRATEGY.register_module("mix")
class MixStrategy:
    """All of a step's rollout rows plus expert rows (is_expert) that make up ``expert_ratio`` of the batch.

    The strategy claims all ``batch_size`` rollout rows -- exactly what the explorer wrote
    for the step (``buffer.train_batch_size`` defaults to explorer batch x group) -- and adds
    :func:`expert_rows_for` expert rows on top. Taking the expert share out of the rollouts
    instead would leave that many sampled rows unclaimed each step: in a FIFO buffer they
    pile up, staleness grows without bound and a part of every step's samples is never
    trained on. Here a synchronous run trains every sampled row once, in the step that made
    it (staleness 0). The batch therefore holds ``batch_size + n_expert`` rows.
    """

    uses_expert_data = True  # the pipeline must hand sample() an ExpertSource (buffer.expert_data)

    def __init__(self, *, params: MixSampleParams) -> None:
        self.params = params
        self.expert_rows = 0  # expert rows served so far (reported, checkpointed)

    def sample(
        self, *, experiences: ExperienceSource, batch_size: int, model_version: int, expert: ExpertSource | None = None
    ) -> list[Experience]:
        if self.params.expert_ratio and expert is None:
            raise ValueError("the mix sample strategy needs an expert dataset (buffer.expert_data)")
        rows = experiences.claim(batch_size, order=self.params.order, timeout=self.params.timeout)
        # On the rows claimed (fewer than batch_size only after a timeout): the share stays r.
        n_expert = expert_rows_for(len(rows), self.params.expert_ratio)
        expert_rows = [dataclasses.replace(e, is_expert=True) for e in expert.next_batch(n_expert)] if n_expert else []
        self.expert_rows += len(expert_rows)
        return rows + expert_rows

    def state_dict(self) -> dict:
        return {"expert_rows": self.expert_rows}

    def load_state_dict(self, state: dict) -> None:
        self.expert_rows = int(state["expert_rows"])


@dataclass(frozen=True)
class StalenessParams(DefaultParams):
    max_staleness: int = 1  # versions a row may lag behind the trainer's model (0: on-policy only)
    mode: Literal["drop", "downweight"] = "drop"  # what happens to a staler row
    decay: float = 0.5  # downweight: weight decay ** (staleness - max_staleness) on its action mask

    def __post_init__(self) -> None:
        if self.max_staleness < 0:
            raise ValueError(f"max_staleness must be >= 0, got {self.max_staleness}")
        if not 0.0 < self.decay <= 1.0:
            raise ValueError(f"decay must be in (0, 1], got {self.decay}")


@SAMPLE_STRATEGY.register_module("staleness")
class StalenessStrategy:
    """Drop (or down-weight) experiences more than max_staleness model versions old."""

    uses_expert_data = False

    def __init__(self, *, params: StalenessParams) -> None:
        self.params = params
        self.dropped = 0  # rows dropped so far
        self.downweighted = 0  # rows down-weighted so far

    def sample(
        self, *, experiences: ExperienceSource, batch_size: int, model_version: int, expert: ExpertSource | None = None
    ) -> list[Experience]:
        oldest = model_version - self.params.max_staleness
        if self.params.mode == "drop":
            self.dropped += experiences.drop_older_than(oldest)
            return experiences.claim(
                batch_size, order=self.params.order, min_model_version=oldest, timeout=self.params.timeout
            )
        rows = experiences.claim(batch_size, order=self.params.order, timeout=self.params.timeout)
        return [self._downweight(e, model_version) for e in rows]

    def _downweight(self, exp: Experience, model_version: int) -> Experience:
        excess = model_version - exp.model_version - self.params.max_staleness
        if excess <= 0:
            return exp
        self.downweighted += 1
        # Mask values are per-token loss weights (trinity_like.ops): this row counts less.
        weight = self.params.decay**excess
        return dataclasses.replace(exp, action_mask=[m * weight for m in exp.mask()])

    def state_dict(self) -> dict:
        return {"dropped": self.dropped, "downweighted": self.downweighted}

    def load_state_dict(self, state: dict) -> None:
        self.dropped, self.downweighted = int(state["dropped"]), int(state["downweighted"])
