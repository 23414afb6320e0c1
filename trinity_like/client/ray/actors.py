"""The bodies of the client's Ray actors: each wraps the in-process client, nothing is redone.

- :class:`LearnerActor` builds an in-process ``ServiceClient`` (local train engine) and one
  ``TrainingClient`` on it, and answers each call with that client's result: the same
  losses, the same checkpoints, the same numbers as in-process.
- :class:`SamplerActor` keeps in-process ``SamplingClient`` objects, one per weights
  version it was asked to sample with; their requests share the actor's one rollout
  engine and batch together as in-process (the actor takes ``max_in_flight`` calls at once).

Weights travel by Ray's object store: the learner's ``weights`` returns the state dict as
an object of its own, the controller passes its reference (inside a :class:`WeightsRef`,
so Ray does not resolve it on every call) and a sampler fetches it the first time it
samples with that version.
"""

from __future__ import annotations

import os
import threading
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import cloudpickle
import ray
import torch
from tinker import types

KEEP_VERSIONS = 2  # sampling clients (weights) a sampler keeps: the newest and the one before


@dataclass(frozen=True)
class WeightsRef:
    """What a sampler samples with: the base model's own weights, a folder, or a learner's
    state dict in the object store (``refs[0]``; a list so Ray hands over the reference)."""

    key: str  # names these weights: equal keys, equal weights
    base_model: str
    version: int = 0  # the learner's optimiser steps when they were taken
    model_path: str | None = None  # a save_weights_for_sampler folder
    refs: list = field(default_factory=list)  # [ObjectRef of a state dict] or []


def _devices(threads: int) -> str:
    """Pin torch to this actor's share: its CPU threads, and its GPU when Ray gave it one."""
    torch.set_num_threads(threads)
    return "cuda" if ray.is_initialized() and ray.get_gpu_ids() else "cpu"


class LearnerActor:
    """A TrainingClient of the in-process backend, inside a Ray actor (calls run in order)."""

    def __init__(
        self,
        service_cls: type,
        service: dict[str, Any],
        create: str,
        args: dict[str, Any],
        threads: int,
        delay_s: float = 0.0,
    ) -> None:
        """``service_cls(**service)``: the in-process ServiceClient (handed over by the caller, so
        this module need not import the one that imports it); ``create(**args)`` makes the client."""
        _devices(threads)
        self._delay_s = delay_s  # test-only: a slow learner
        self._service = service_cls(**service)
        self._client = getattr(self._service, create)(**args)

    def info(self) -> tuple[str, types.GetInfoResponse, int]:
        return self._client.model_id, self._client.get_info(), os.getpid()

    def pid(self) -> int:
        return os.getpid()

    def forward(self, data: list[types.Datum], loss_fn: str, config: Any) -> types.ForwardBackwardOutput:
        return self._client.forward(data, loss_fn, config).result()

    def forward_backward(self, data: list[types.Datum], loss_fn: str, config: Any) -> types.ForwardBackwardOutput:
        if self._delay_s:
            time.sleep(self._delay_s)
        return self._client.forward_backward(data, loss_fn, config).result()

    def forward_backward_custom(
        self, data: list[types.Datum], loss_fn: bytes, loss_type_input: str | None
    ) -> types.ForwardBackwardOutput:
        """``loss_fn``: the caller's function, cloudpickled (by value when defined in ``__main__``
        or a function body; by reference, so importable here, when defined at a module's top)."""
        if self._delay_s:
            time.sleep(self._delay_s)
        fn = cloudpickle.loads(loss_fn)
        return self._client.forward_backward_custom(data, fn, loss_type_input=loss_type_input).result()

    def optim_step(self, optim_params: Any, adam_params: Any) -> tuple[types.OptimStepResponse, int]:
        out = self._client.optim_step(optim_params, adam_params=adam_params).result()
        return out, self._client._version  # the step id after this step

    def save_state(self, name: str, overwrite: bool) -> types.SaveWeightsResponse:
        return self._client.save_state(name, overwrite=overwrite).result()

    def load_state(self, path: str, with_optimizer: bool) -> types.LoadWeightsResponse:
        client = self._client
        return (client.load_state_with_optimizer(path) if with_optimizer else client.load_state(path)).result()

    def save_weights_for_sampler(self, name: str) -> types.SaveWeightsForSamplerResponse:
        return self._client.save_weights_for_sampler(name).result()

    @ray.method(num_returns=2)
    def weights(self) -> tuple[dict[str, torch.Tensor], int]:
        """The merged weights (a state dict: its own object in the store) and their version,
        once every earlier call has run."""
        sampler = self._client.snapshot_sampler().result()
        return sampler._weights, sampler.version

    def close(self) -> None:
        self._service.close()


class SamplerActor:
    """In-process SamplingClients inside a Ray actor; concurrent calls share one engine."""

    def __init__(self, threads: int, delay_s: float = 0.0) -> None:
        self._device = _devices(threads)
        self._delay_s = delay_s  # test-only: a slow sampler
        self._lock = threading.Lock()
        self._clients: OrderedDict[str, Any] = OrderedDict()

    def pid(self) -> int:
        return os.getpid()

    def _client(self, weights: WeightsRef):
        from trinity_like.client.sampling import SamplingClient

        with self._lock:
            client = self._clients.get(weights.key)
            if client is None:
                state = ray.get(weights.refs[0]) if weights.refs else None
                client = SamplingClient(
                    weights.base_model,
                    model_path=weights.model_path,
                    weights=state,
                    version=weights.version,
                    device=self._device,
                )
                self._clients[weights.key] = client
                while len(self._clients) > KEEP_VERSIONS:
                    self._clients.popitem(last=False)
            self._clients.move_to_end(weights.key)
            return client

    def _wait(self) -> None:
        if self._delay_s:
            time.sleep(self._delay_s)

    def sample(
        self,
        weights: WeightsRef,
        prompt: types.ModelInput,
        num_samples: int,
        params: types.SamplingParams,
        include_prompt_logprobs: bool,
        prompt_logprobs_last_n: int | None,
    ) -> types.SampleResponse:
        self._wait()
        return (
            self._client(weights)
            .sample(prompt, num_samples, params, include_prompt_logprobs, prompt_logprobs_last_n=prompt_logprobs_last_n)
            .result()
        )

    def compute_logprobs(
        self, weights: WeightsRef, prompt: types.ModelInput, prompt_logprobs_last_n: int | None
    ) -> list[float | None]:
        self._wait()
        return self._client(weights).compute_logprobs(prompt, prompt_logprobs_last_n).result()

    def run_requests(self, weights: WeightsRef, requests: Sequence[Any], sampling: Any) -> list[Any]:
        self._wait()
        return self._client(weights).run_requests(requests, sampling)
