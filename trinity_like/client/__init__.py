"""A Tinker-compatible client over trinity_like's engines, in-process.

Code written for the ``tinker`` SDK ports by changing one import::

    import trinity_like.client as tinker          # was: import tinker
    service = tinker.ServiceClient()
    training = service.create_lora_training_client("smollm2-135m-instruct", rank=16)
    datum = tinker.types.Datum(model_input=tinker.types.ModelInput.from_ints([1, 2, 3]),
                               loss_fn_inputs={"target_tokens": [2, 3, 4], "weights": [1.0, 1.0, 1.0]})
    training.forward_backward([datum], "cross_entropy").result()
    training.optim_step(tinker.types.AdamParams(learning_rate=1e-4)).result()

Requests and responses are the SDK's own ``tinker.types`` (so tinker-cookbook helpers that
build them work unchanged); the clients are ours: :class:`~.service.ServiceClient`,
:class:`~.training.TrainingClient`, :class:`~.sampling.SamplingClient`. Renderers are in
:mod:`.renderers`. The clients load lazily: importing this package imports only the types.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tinker import APIFuture, types
from tinker.types import (
    AdamParams,
    Datum,
    EncodedTextChunk,
    ForwardBackwardOutput,
    ModelInput,
    ModelInputChunk,
    OptimStepResponse,
    SampledSequence,
    SampleResponse,
    SamplingParams,
    StopReason,
    TensorData,
    TensorDtype,
)

if TYPE_CHECKING:
    from trinity_like.client.sampling import SamplingClient
    from trinity_like.client.service import ServiceClient
    from trinity_like.client.training import TrainingClient

_CLIENTS = {
    "ServiceClient": "trinity_like.client.service",
    "TrainingClient": "trinity_like.client.training",
    "SamplingClient": "trinity_like.client.sampling",
}

__all__ = [
    "APIFuture",
    "AdamParams",
    "Datum",
    "EncodedTextChunk",
    "ForwardBackwardOutput",
    "ModelInput",
    "ModelInputChunk",
    "OptimStepResponse",
    "SampleResponse",
    "SampledSequence",
    "SamplingClient",
    "SamplingParams",
    "ServiceClient",
    "StopReason",
    "TensorData",
    "TensorDtype",
    "TrainingClient",
    "types",
]


def __getattr__(name: str) -> Any:
    if name in _CLIENTS:
        import importlib

        return getattr(importlib.import_module(_CLIENTS[name]), name)
    raise AttributeError(f"module 'trinity_like.client' has no attribute {name!r}")
