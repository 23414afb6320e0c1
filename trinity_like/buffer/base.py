"""What sample strategies (and the trainer) need of the buffer.

Storages implement :class:`ExperienceSource` (everything the pipeline calls on a buffer); an expert dataset (MIX) implements
:class:`ExpertSource`. A sample strategy is a registered class::

    @SAMPLE_STRATEGY.register_module("default")
    class DefaultStrategy:
        \"\"\"Take the oldest unclaimed experiences first.\"\"\"
        def __init__(self, *, params: DefaultParams): ...
        def sample(self, *, experiences, batch_size, model_version, expert=None) -> list[Experience]: ...
        def state_dict(self) -> dict: ...
        def load_state_dict(self, state: dict) -> None: ...

Rows a strategy returns were *claimed*: the storage hands them to no one else, and marks
them consumed only when the training step that used them is committed to a checkpoint
(:meth:`ExperienceSource.commit`); claims not committed before a crash come back.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from trinity_like.buffer.rows import TrainedRecord
from trinity_like.experience import Experience

# Orders a storage can hand rows out in.
ORDERS = ("fifo", "newest_version")


@runtime_checkable
class ExperienceSource(Protocol):
    def claim(
        self,
        n: int,
        *,
        order: str = "fifo",
        min_model_version: int | None = None,
        timeout: float | None = None,
    ) -> list[Experience]:
        """Claim up to ``n`` unclaimed rows (``timeout`` None: wait until ``n`` are there).

        ``order``: "fifo" (oldest written first) or "newest_version" (highest model
        version first). ``min_model_version``: rows below it are never returned.
        """

    def drop_older_than(self, model_version: int) -> int:
        """Mark unclaimed rows produced before ``model_version`` as dropped; returns how many."""

    def put(self, rows: Sequence[Experience]) -> None:
        """Append rows (transactionally)."""

    def commit(self, step: int) -> None:
        """Mark every row claimed so far as consumed by training step ``step``."""

    def count(self, status: str = "available") -> int:
        """Rows in a state: "available", "claimed", "consumed", "dropped"."""

    def mark_writer_done(self) -> None:
        """No more rows will come: a claim waiting for ``n`` rows returns what there is."""

    def recover(self, checkpoint_step: int | None = None) -> dict[str, int]:
        """Reconcile the buffer with the checkpoint a run resumes from (None: no checkpoint);
        returns how many rows moved, by kind. A storage that keeps nothing across runs moves none."""

    def close(self) -> None:
        """Release files and connections."""


@runtime_checkable
class TrainingRecorder(Protocol):
    """A storage that also keeps what the trainer computed for the rows it trained on
    (``sqlite``: for ``trinity-like view``). The trainer records into any storage that is
    one; a storage that is not (``memory``: nothing outlives the process) is passed over."""

    def record_trained(self, step: int, records: Sequence[TrainedRecord]) -> None:
        """Keep ``records`` (:class:`~trinity_like.buffer.rows.TrainedRecord`) of step ``step``."""


@runtime_checkable
class ExpertSource(Protocol):
    def next_batch(self, n: int) -> list[Experience]:
        """The next ``n`` expert rows (``is_expert=True``), cycling through epochs."""


@runtime_checkable
class SampleStrategy(Protocol):
    """Picks each training batch (the SAMPLE_STRATEGY registry's classes).

    A strategy that mixes rows of ``buffer.expert_data`` into its batches declares it with
    a class attribute ``uses_expert_data = True``: the recipe must then name expert data,
    and the pipeline hands it over as ``expert``.
    """

    def sample(
        self, *, experiences: ExperienceSource, batch_size: int, model_version: int, expert: ExpertSource | None = None
    ) -> list[Experience]:
        """Claim the rows of the next training batch."""

    def state_dict(self) -> dict:
        """Counters to checkpoint."""

    def load_state_dict(self, state: dict) -> None:
        """Restore :meth:`state_dict`."""
