"""The weights the trainer sent, by name, and the check that every trained row was sampled by one of them.

At each sync the trainer records ``(version, digest)`` of the tensors it sends
(:func:`~trinity_like.models.weight_digest.weights_digest`, in the rollout engine's dtype);
version 0 is the starting weights. Every rollout engine computes the digest again from
what its model holds after the load and stamps it, with the version, on every row. Before
a batch trains, :meth:`WeightLedger.check` refuses, with one line naming the step, the
version and both digests, a row

- whose (version, digest) is not one the trainer sent (an update dropped on the way,
  applied to all tensors but one, a LoRA adapter never merged: the engine took the version
  number but not the weights), or
- whose version is one the trainer sent but older than the recipe allows for the batch the
  row was explored for (``explore_step``): ``needed(s) = (s - 1 - offset) // interval *
  interval`` of ``synchronizer`` (:func:`needed_version`, the version
  the explorer waits for before batch ``s``). An engine that missed an update altogether,
  version number and all -- one engine of two that the update never reached -- samples with
  weights the trainer did send, just too old; only the window names it::

    ledger = WeightLedger.for_config(config)
    ledger.record(3, actor.export_weights())         # at the sync of step 3
    ledger.check(step=4, rows=batch_rows, trainer_version=3)

The window is the row's batch's, not the training step's: rows a smaller
``buffer.train_batch_size`` leaves in the buffer train later, and how old a row may be when
it trains stays with the sample strategy (``staleness``: ``max_staleness``, logged as
``staleness/*``). A row without ``explore_step`` (0: written before the field, or not by a
recipe's explorer) is held to no window. The ledger is saved in every checkpoint (a resumed
trainer still knows the versions it sent before the kill). What the digest can miss is in
:mod:`trinity_like.models.weight_digest`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trinity_like.errors import TrinityError
from trinity_like.experience import Experience
from trinity_like.models.weight_digest import weights_digest
from trinity_like.trainer.shared_weights import SharedWeights

if TYPE_CHECKING:
    import torch

    from trinity_like.config.schema import Config

KEY = "weights_sent"  # the checkpoint state's key


def tensors_of(weights: Any) -> Mapping[str, torch.Tensor]:
    """The tensors of a sync's weights: a state dict, shared weights, or a model folder (read lazily)."""
    if isinstance(weights, SharedWeights):
        return weights.tensors()
    if isinstance(weights, (str, Path)):
        from safetensors.torch import load_file

        state: dict = {}
        for file in sorted(Path(weights).glob("*.safetensors")):
            state.update(load_file(str(file)))
        return state
    return weights


def needed_version(step: int, offset: int, interval: int) -> int:
    """The oldest trainer version that may sample the batch of ``step``: that of step
    ``step - 1 - offset``, rounded down to a step at which weights are published."""
    behind = max(0, step - 1 - offset)
    return behind // interval * interval


class WeightLedger:
    """``version -> digest`` of every weight update the trainer sent (see the module doc)."""

    def __init__(self, dtype: torch.dtype | None = None, offset: int = 0, interval: int = 1) -> None:
        self.dtype = dtype  # the rollout engine's: the digest is of the weights as it will hold them
        self.offset, self.interval = offset, interval  # synchronizer.offset / interval: the staleness window
        self.sent: dict[int, str] = {}

    @classmethod
    def for_config(cls, config: Config) -> WeightLedger:
        from trinity_like.models.device import resolve_device, rollout_dtype

        sync = config.synchronizer
        dtype = rollout_dtype(config.explorer.dtype, resolve_device(config.cluster.device))
        return cls(dtype, offset=sync.offset, interval=sync.interval)

    def oldest(self, explore_step: int) -> int:
        """The oldest version that may sample the batch of ``explore_step`` (0 for a row without one)."""

        return needed_version(explore_step, self.offset, self.interval) if explore_step > 0 else 0

    def record(self, version: int, weights: Any) -> str:
        """Name the weights sent as ``version``; returns their digest."""
        digest = weights_digest(tensors_of(weights), dtype=self.dtype)
        self.sent[int(version)] = digest
        return digest

    def check(self, step: int, rows: Iterable[Experience], trainer_version: int) -> None:
        """Raise (one line) on the first sampled row whose (version, digest) the trainer did not
        send, or sent longer ago than the row's batch allows (see the module doc)."""
        for row in rows:
            if row.is_expert:  # demonstrations (MIX): never sampled
                continue
            version, found = int(row.model_version), row.weights_digest or "none"
            expected = self.sent.get(version) if version <= trainer_version else None
            oldest = self.oldest(int(row.explore_step))
            if expected == found and version >= oldest:
                continue
            if expected is None:
                why = f"the trainer never sent v{version} (it is at v{trainer_version})"
            elif expected != found:
                why = "the explorer does not hold the weights sent (an update dropped, partial, or not merged)"
            else:  # the weights sent as `version`, but too old: name the oldest the batch allows
                expected = self.sent.get(oldest, "none")
                why = (
                    f"the batch of step {row.explore_step} needs v{oldest} or newer (synchronizer.offset "
                    f"{self.offset}, interval {self.interval}): an update that never reached the explorer"
                )
            raise TrinityError(
                f"step {step}: row {row.eid[:12]} of task {row.task_id!r} was sampled by weights v{version} "
                f"with digest {found}, expected {expected or 'none'}: {why}; refusing to train on it"
            )

    def state_dict(self) -> dict[str, str]:
        return {str(v): d for v, d in sorted(self.sent.items())}

    def load_state_dict(self, state: Mapping[str, str] | None) -> None:
        self.sent.update({int(v): str(d) for v, d in (state or {}).items()})
