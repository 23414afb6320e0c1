"""The Tinker-compatible clients over Ray actors: same methods, same types, as in-process.

``ServiceClient(backend="ray", ray=RayClientConfig(...))`` builds a :class:`RayRuntime`:
Ray (started here, or an existing cluster), one placement group (learner bundle first,
then one per sampler), the :class:`~.pool.SamplerPool`. Its training clients are
:class:`RayTrainingClient` (a :class:`~.actors.LearnerActor` each) and its sampling clients
:class:`RaySamplingClient` (requests spread over the pool). Each call returns a future
over a Ray object reference (:func:`~trinity_like.client.futures.ray_future`): ``.result()``
blocks, ``await`` works; one training client's calls run in call order (one caller, one
actor). ``save_weights_and_get_sampling_client`` hands the learner's state dict to the
samplers through Ray's object store, not through a file.

A learner is never restarted (its weights and optimiser live in its memory only): when
its process dies, every call of its client fails with one line that says how to resume
from the last ``save_state``.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import sys
import threading
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

import cloudpickle
import ray
from ray.exceptions import RayActorError
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy
from tinker import types
from tinker.lib.public_interfaces.api_future import AwaitableConcurrentFuture

from trinity_like.client.futures import checkpoint_path, ray_future, sampler_weights_path, unwrap_ray_error
from trinity_like.client.ray.actors import LearnerActor, SamplerActor, WeightsRef
from trinity_like.client.ray.config import RayClientConfig
from trinity_like.client.ray.pool import SamplerPool
from trinity_like.client.sampling import _reject_unsupported
from trinity_like.client.spellings import TrainingAsyncSpellings
from trinity_like.errors import TrinityError
from trinity_like.models.resolve import load_tokenizer, resolve_model_path
from trinity_like.plugins import ray_runtime_env

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


def _compute(resources: Mapping[str, float]) -> dict[str, float]:
    return {k: resources[k] for k in ("CPU", "GPU") if k in resources}


class RayRuntime:
    """Ray, the placement group and the samplers of one ServiceClient; :meth:`close` undoes
    only what it did (its actors and group; Ray itself only if it started or connected it)."""

    def __init__(self, config: RayClientConfig) -> None:
        from trinity_like.trainer.verl_engine import check_reachable

        self.config = config
        self._own_ray = False
        self._group = None
        self.pool: SamplerPool | None = None
        self._learner_taken = False
        if not ray.is_initialized():
            if config.address is not None:
                check_reachable(config.address)
                ray.init(address=config.address, runtime_env=ray_runtime_env(), log_to_driver=False)
            else:  # logical CPUs: by default enough for every bundle, even beyond the machine's cores
                cpus = config.num_cpus if config.num_cpus is not None else max(os.cpu_count() or 1, config.cpus())
                ray.init(
                    address="local",
                    num_cpus=cpus,
                    include_dashboard=False,
                    runtime_env=ray_runtime_env(),
                    log_to_driver=False,
                )
            self._own_ray = True
        try:
            self._place()
            self.pool = SamplerPool(
                [self._sampler(i) for i in range(len(config.samplers))],
                max_in_flight=config.max_in_flight,
                max_retries=config.max_restarts + 1,
            )
        except BaseException:
            self.close()
            raise

    @property
    def placement_group(self) -> Any:
        """The Ray placement group holding this runtime's bundles (None once closed)."""
        return self._group

    def _place(self) -> None:
        c = self.config
        total = ray.cluster_resources()
        short = {k: v for k, v in (("CPU", c.cpus()), ("GPU", c.gpus())) if v > total.get(k, 0)}
        if short and self._own_ray:  # a Ray of ours will never grow: say so now instead of waiting
            raise TrinityError(
                f"the client's bundles need {short} but the Ray started here has "
                f"{ {k: total.get(k, 0) for k in short} } (set ray.num_cpus, or fewer bundles)"
            )
        self._group = placement_group(
            c.bundles(), strategy=c.strategy, name=f"trinity-like-client-{uuid.uuid4().hex[:8]}"
        )
        ready, _ = ray.wait([self._group.ready()], timeout=c.placement_timeout_s)
        if not ready:
            raise TrinityError(
                f"Ray could not place the client's bundles {c.bundles()} ({c.strategy}) within "
                f"{c.placement_timeout_s:.0f} s; the cluster has {_compute(ray.available_resources())} free"
            )

    def _at(self, index: int, bundle: Any) -> dict[str, Any]:
        """Actor options: the bundle's resources, in bundle ``index`` of the group."""
        return {
            "num_cpus": bundle.CPU,
            "num_gpus": bundle.GPU,
            "runtime_env": ray_runtime_env(),
            "scheduling_strategy": PlacementGroupSchedulingStrategy(self._group, placement_group_bundle_index=index),
        }

    def _sampler(self, i: int) -> Any:
        bundle = self.config.samplers[i]
        cls = ray.remote(SamplerActor).options(
            max_restarts=self.config.max_restarts,
            max_task_retries=0,
            max_concurrency=self.config.max_in_flight,
            **self._at(1 + i, bundle),
        )
        return cls.remote(bundle.threads, self.config.sampler_delay_s)

    def learner(self, service_cls: type, service: dict[str, Any], create: str, args: dict[str, Any]) -> Any:
        """A new LearnerActor in the learner bundle (one live learner per ServiceClient):
        ``service_cls(**service).<create>(**args)`` is its in-process training client."""
        if self._learner_taken:
            raise TrinityError(
                "this ServiceClient(backend='ray') has one learner bundle and its training client is "
                "still open: close() it first, or use another ServiceClient"
            )
        bundle = self.config.learner
        cls = ray.remote(LearnerActor).options(max_restarts=0, max_task_retries=0, **self._at(0, bundle))
        self._learner_taken = True
        return cls.remote(service_cls, service, create, args, bundle.threads, self.config.learner_delay_s)

    def learner_released(self) -> None:
        self._learner_taken = False

    def close(self) -> None:
        if self.pool is not None:
            self.pool.close()
            self.pool = None
        if self._group is not None and ray.is_initialized():
            remove_placement_group(self._group)
            self._group = None
        if self._own_ray and ray.is_initialized():
            ray.shutdown()
            self._own_ray = False


# -- sampling ------------------------------------------------------------------------------------------
class RaySamplingClient:
    """The in-process ``SamplingClient``'s API; each request runs on one sampler actor of the pool."""

    def __init__(self, runtime: RayRuntime, weights: WeightsRef) -> None:
        self._runtime = runtime
        self._weights = weights
        self.version = weights.version
        self._tokenizer = None

    def result(self, timeout: float | None = None) -> RaySamplingClient:
        return self

    def __await__(self):
        yield from ()
        return self

    @property
    def model_path(self) -> str | None:
        return self._weights.model_path

    def _pool(self) -> SamplerPool:
        if self._runtime.pool is None:
            raise TrinityError("this ServiceClient is closed: its samplers are gone")
        return self._runtime.pool

    def sample(
        self,
        prompt: types.ModelInput,
        num_samples: int,
        sampling_params: types.SamplingParams,
        include_prompt_logprobs: bool = False,
        topk_prompt_logprobs: int = 0,
        topk_sample_logprobs: int = 0,
        target_prompt_logprobs: types.TensorData | None = None,
        prompt_alt_tokens_k: int = 0,
        prompt_logprobs_last_n: int | None = None,
    ) -> AwaitableConcurrentFuture[types.SampleResponse]:
        """As in-process; a seed left None is drawn here, so a retried request samples the same tokens."""
        _reject_unsupported(
            topk_prompt_logprobs=topk_prompt_logprobs,
            topk_sample_logprobs=topk_sample_logprobs,
            target_prompt_logprobs=target_prompt_logprobs,
            prompt_alt_tokens_k=prompt_alt_tokens_k,
        )
        if prompt_logprobs_last_n is not None and not include_prompt_logprobs:
            raise ValueError("prompt_logprobs_last_n applies to prompt logprobs; set include_prompt_logprobs")
        if isinstance(sampling_params, types.SamplingParams) and sampling_params.seed is None:
            sampling_params = sampling_params.model_copy(update={"seed": secrets.randbits(63)})
        return self._pool().submit(
            "sample",
            self._weights,
            prompt,
            num_samples,
            sampling_params,
            include_prompt_logprobs,
            prompt_logprobs_last_n,
        )

    async def sample_async(
        self, prompt: types.ModelInput, num_samples: int, sampling_params: types.SamplingParams, **options: Any
    ) -> types.SampleResponse:
        return await self.sample(prompt, num_samples, sampling_params, **options)

    def compute_logprobs(
        self,
        prompt: types.ModelInput,
        prompt_logprobs_last_n: int | None = None,
    ) -> AwaitableConcurrentFuture[list[float | None]]:
        return self._pool().submit("compute_logprobs", self._weights, prompt, prompt_logprobs_last_n)

    async def compute_logprobs_async(
        self, prompt: types.ModelInput, prompt_logprobs_last_n: int | None = None
    ) -> list[float | None]:
        return await self.compute_logprobs(prompt, prompt_logprobs_last_n)

    def run_requests(self, requests: Sequence[Any], sampling: Any) -> list[Any]:
        """The engine's requests (each with its own seeds), split evenly over the samplers: each
        request's samples depend on its seeds only, so the split changes no sample."""
        requests = list(requests)
        if not requests:
            return []
        n = min(self._pool().size(), len(requests))
        parts = [requests[len(requests) * i // n : len(requests) * (i + 1) // n] for i in range(n)]
        futures = [self._pool().submit("run_requests", self._weights, part, sampling) for part in parts]
        return [group for future in futures for group in future.result()]

    def get_tokenizer(self) -> Any:
        if self._tokenizer is None:
            self._tokenizer = load_tokenizer(resolve_model_path(self._weights.base_model))
        return self._tokenizer

    def get_base_model(self) -> str:
        return self._weights.base_model


# -- training ------------------------------------------------------------------------------------------
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


def base_sampler(runtime: RayRuntime, base_model: str, model_path: str | None) -> RaySamplingClient:
    """A sampler over ``base_model``'s own weights or a ``save_weights_for_sampler`` folder."""
    key = f"folder:{model_path}:{uuid.uuid4().hex}" if model_path else f"base:{base_model}"
    return RaySamplingClient(runtime, WeightsRef(key, base_model, model_path=model_path))
