"""The weights the trainer sent, by name, and the check that every trained row was sampled by one of them.

At each sync the trainer records ``(version, digest)`` of the tensors it sends
(:func:`~trinity_like.models.weight_digest.weights_digest`, in the rollout engine's dtype);
version 0 is the starting weights. Every rollout engine computes the digest again from
what its model holds after the load and stamps it, with the version, on every row. Before
a batch trains, :meth:`WeightLedger.check` refuses a row whose identity is not one the
trainer sent, with one line naming the step, the version and both digests::

    ledger = WeightLedger.for_config(config)
    ledger.record(3, actor.export_weights())         # at the sync of step 3
    ledger.check(step=4, rows=batch_rows, trainer_version=3)

So an update dropped on the way, applied to one engine of two, applied to all tensors but
one, or a LoRA adapter never merged stops the run at the first step that would train on
such samples, instead of drifting ``train/sampler_kl_k3``. The ledger is saved in every
checkpoint (a resumed trainer still knows the versions it sent before the kill). What the
digest can miss is in :mod:`trinity_like.models.weight_digest`. Staleness itself (how old
a sent version may be) stays with the schedule and the sample strategy (``staleness/*``).
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


class WeightLedger:
    """``version -> digest`` of every weight update the trainer sent (see the module doc)."""

    def __init__(self, dtype: torch.dtype | None = None) -> None:
        self.dtype = dtype  # the rollout engine's: the digest is of the weights as it will hold them
        self.sent: dict[int, str] = {}

    @classmethod
    def for_config(cls, config: Config) -> WeightLedger:
        from trinity_like.models.device import resolve_device, rollout_dtype

        return cls(rollout_dtype(config.explorer.dtype, resolve_device(config.cluster.device)))

    def record(self, version: int, weights: Any) -> str:
        """Name the weights sent as ``version``; returns their digest."""
        digest = weights_digest(tensors_of(weights), dtype=self.dtype)
        self.sent[int(version)] = digest
        return digest

    def check(self, step: int, rows: Iterable[Experience], trainer_version: int) -> None:
        """Raise (one line) on the first sampled row whose (version, digest) the trainer did not send."""
        for row in rows:
            if row.is_expert:  # demonstrations (MIX): never sampled
                continue
            version, found = int(row.model_version), row.weights_digest or "none"
            expected = self.sent.get(version) if version <= trainer_version else None
            if expected == found:
                continue
            why = (
                f"the trainer never sent v{version} (it is at v{trainer_version})"
                if expected is None
                else "the explorer does not hold the weights sent (an update dropped, partial, or not merged)"
            )
            raise TrinityError(
                f"step {step}: row {row.eid[:12]} of task {row.task_id!r} was sampled by weights v{version} "
                f"with digest {found}, expected {expected or 'none'}: {why}; refusing to train on it"
            )

    def state_dict(self) -> dict[str, str]:
        return {str(v): d for v, d in sorted(self.sent.items())}

    def load_state_dict(self, state: Mapping[str, str] | None) -> None:
        self.sent.update({int(v): str(d) for v, d in (state or {}).items()})
