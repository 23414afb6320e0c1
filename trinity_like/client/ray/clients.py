"""The training client over Ray: the in-process ``TrainingClient``'s API on a learner actor.

Each :class:`RayTrainingClient` drives one :class:`~.actors.LearnerActor` (made by
:meth:`~.runtime.RayRuntime.learner` in the learner bundle), which holds the in-process
client and its engine. Each call returns a future over a Ray object reference
(:func:`~trinity_like.client.futures.ray_future`): ``.result()`` blocks, ``await`` works;
one training client's calls run in call order (one caller, one actor). What it checks of
its data is what the in-process client checks, inside the actor.
``save_weights_and_get_sampling_client`` hands the learner's state dict to the samplers
(:mod:`.sampling`) through Ray's object store, not through a file.

A learner is never restarted (its weights and optimiser live in its memory only): when
its process dies, every call of its client fails with one line that says how to resume
from the last ``save_state``.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import uuid
from collections.abc import Mapping
from typing import Any

import cloudpickle
import ray
from ray.exceptions import RayActorError
from tinker import types
from tinker.lib.public_interfaces.api_future import AwaitableConcurrentFuture

from trinity_like.client.futures import checkpoint_path, ray_future, sampler_weights_path, unwrap_ray_error
from trinity_like.client.ray.actors import WeightsRef
from trinity_like.client.ray.runtime import RayRuntime
from trinity_like.client.ray.sampling import RaySamplingClient
from trinity_like.client.spellings import TrainingAsyncSpellings
from trinity_like.errors import TrinityError
from trinity_like.models.resolve import load_tokenizer, resolve_model_path

_PICKLE_LOCK = threading.Lock()  # cloudpickle's by-value registry is process-wide


def pickled_by_value(fn: Any) -> bytes:
    """``fn`` cloudpickled with its own module's functions and globals by value: the Ray worker
    need not import the caller's script or test file (other modules it uses still by name)."""
    module = sys.modules.get(getattr(fn, "__module__", None) or "")
    if module is None or module.__name__ == "__main__":  # __main__ goes by value anyway
        return cloudpickle.dumps(fn)
    with _PICKLE_LOCK:
        registered = module.__name__ in cloudpickle.list_registry_pickle_by_value()
        if not registered:
            cloudpickle.register_pickle_by_value(module)
        try:
            return cloudpickle.dumps(fn)
        finally:
            if not registered:
                cloudpickle.unregister_pickle_by_value(module)


class RayTrainingClient(TrainingAsyncSpellings):
    """The in-process ``TrainingClient``'s API over a :class:`~.actors.LearnerActor`."""

    def __init__(self, runtime: RayRuntime, actor: Any, *, base_model: str, lora: Any) -> None:
        self._runtime = runtime
        self._actor = actor
        self._last_state: str | None = None  # path of the last save_state: what a resume starts from
        self._closed = False
        try:
            self.model_id, self._info, self._pid = ray.get(actor.info.remote())
        except RayActorError as exc:
            runtime.learner_released()
            raise TrinityError(f"the learner actor could not start: {str(exc).splitlines()[0]}") from None
        except ray.exceptions.RayTaskError as exc:
            runtime.learner_released()
            raise unwrap_ray_error(exc) from None
        self.base_model = base_model
        self._lora = lora
        self._tokenizer = None
        self.version = 0  # optimiser steps taken, as the learner last reported

    def result(self, timeout: float | None = None) -> RayTrainingClient:
        return self

    def __await__(self):
        yield from ()
        return self

    def learner_pid(self) -> int:
        """The learner actor's process id (ours: for tests and monitoring)."""
        return self._pid

    def _died(self, exc: BaseException) -> BaseException:
        """A dead learner as one line that says how to resume; any other error as the learner raised it."""
        if not isinstance(exc, RayActorError):
            return unwrap_ray_error(exc)
        if self._last_state is not None:
            how = (
                f"resume from its last saved state with ServiceClient(backend='ray')"
                f".create_training_client_from_state_with_optimizer({self._last_state!r})"
            )
        else:
            how = (
                "no save_state was taken by this client, so nothing can be resumed: start again (save_state regularly)"
            )
        return TrinityError(
            f"the learner actor of {self.model_id} (pid {self._pid}) died; its weights and optimiser "
            f"state since the last save are lost: {how}"
        )

    def _call(self, method: str, *args: Any, then: Any = None) -> AwaitableConcurrentFuture:
        if self._closed:
            raise TrinityError(f"training client {self.model_id} is closed")
        return ray_future(getattr(self._actor, method).remote(*args), then=then, error=self._died)

    # -- forward / backward ---------------------------------------------------------------------
    def forward(
        self,
        data: list[types.Datum],
        loss_fn: types.LossFnType,
        loss_fn_config: Mapping[str, float | str] | None = None,
    ) -> AwaitableConcurrentFuture[types.ForwardBackwardOutput]:
        return self._call("forward", data, loss_fn, loss_fn_config)

    def forward_backward(
        self,
        data: list[types.Datum],
        loss_fn: types.LossFnType,
        loss_fn_config: Mapping[str, float | str] | None = None,
    ) -> AwaitableConcurrentFuture[types.ForwardBackwardOutput]:
        return self._call("forward_backward", data, loss_fn, loss_fn_config)

    def forward_backward_custom(
        self,
        data: list[types.Datum],
        loss_fn: Any,
        *,
        loss_type_input: str | None = None,
    ) -> AwaitableConcurrentFuture[types.ForwardBackwardOutput]:
        """``loss_fn`` is cloudpickled to the learner by value, with what it uses from its own
        module (a script, a notebook, a test file); other modules it imports must be importable
        by the Ray workers, as for any Ray task."""
        if not callable(loss_fn):
            raise TypeError(f"loss_fn must be callable (data, logprobs_list) -> (loss, metrics), got {loss_fn!r}")
        return self._call("forward_backward_custom", data, pickled_by_value(loss_fn), loss_type_input)

    # -- optimiser ---------------------------------------------------------------------------------
    def optim_step(
        self, optim_params: types.AdamParams | None = None, *, adam_params: types.AdamParams | None = None
    ) -> AwaitableConcurrentFuture[types.OptimStepResponse]:
        def step(out: tuple[types.OptimStepResponse, int]) -> types.OptimStepResponse:
            self.version = out[1]
            return out[0]

        return self._call("optim_step", optim_params, adam_params, then=step)

    # -- checkpoints and sampling --------------------------------------------------------------------
    def save_state(
        self,
        name: str,
        ttl_seconds: int | None = None,
        overwrite: bool = False,
        user_metadata: dict[str, str] | None = None,
    ) -> AwaitableConcurrentFuture[types.SaveWeightsResponse]:
        def saved(out: types.SaveWeightsResponse) -> types.SaveWeightsResponse:
            self._last_state = out.path
            return out

        return self._call("save_state", name, overwrite, then=saved)

    def load_state(self, path: str) -> AwaitableConcurrentFuture[types.LoadWeightsResponse]:
        return self._call("load_state", checkpoint_path(path, "load_state"), False)

    def load_state_with_optimizer(self, path: str) -> AwaitableConcurrentFuture[types.LoadWeightsResponse]:
        return self._call("load_state", checkpoint_path(path, "load_state_with_optimizer"), True)

    def save_weights_for_sampler(
        self,
        name: str,
        ttl_seconds: int | None = None,
        user_metadata: dict[str, str] | None = None,
    ) -> AwaitableConcurrentFuture[types.SaveWeightsForSamplerResponse]:
        return self._call("save_weights_for_sampler", name)

    def save_weights_and_get_sampling_client(
        self,
        name: str | None = None,
        retry_config: Any = None,
        record_stability_info: bool = False,
        kind: str = "snapshot",
    ) -> RaySamplingClient:
        """A sampler over the current weights, once every earlier call has run; the weights go
        to the samplers through the object store."""
        if kind != "snapshot":
            raise ValueError(f"kind {kind!r}: only 'snapshot' sampling clients exist here")
        return self.snapshot_sampler().result()

    def snapshot_sampler(self) -> AwaitableConcurrentFuture[RaySamplingClient]:
        if self._closed:
            raise TrinityError(f"training client {self.model_id} is closed")
        state_ref, version_ref = self._actor.weights.remote()

        def sampler(version: int) -> RaySamplingClient:
            key = f"{self.model_id}:{uuid.uuid4().hex}"
            return RaySamplingClient(self._runtime, WeightsRef(key, self.base_model, version, refs=[state_ref]))

        return ray_future(version_ref, then=sampler, error=self._died)

    def create_sampling_client(self, model_path: str, retry_config: Any = None) -> RaySamplingClient:
        path = sampler_weights_path(model_path, "create_sampling_client")
        ref = WeightsRef(f"folder:{path}:{uuid.uuid4().hex}", self.base_model, model_path=path)
        return RaySamplingClient(self._runtime, ref)

    # -- information ------------------------------------------------------------------------------
    def get_info(self) -> types.GetInfoResponse:
        return self._info

    def get_tokenizer(self) -> Any:
        if self._tokenizer is None:
            self._tokenizer = load_tokenizer(resolve_model_path(self.base_model))
        return self._tokenizer

    def close(self) -> None:
        """Finish queued calls, then end the learner actor and free its bundle."""
        if self._closed:
            return
        self._closed = True
        with contextlib.suppress(RayActorError):  # already dead: nothing left to finish
            ray.get(self._actor.close.remote())
        ray.kill(self._actor, no_restart=True)
        self._runtime.learner_released()
