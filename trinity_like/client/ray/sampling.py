"""The sampling clients over Ray: the in-process ``SamplingClient``'s API, requests spread over the pool.

A :class:`RaySamplingClient` holds a :class:`~.actors.WeightsRef` (a learner's state dict
in Ray's object store, a ``save_weights_for_sampler`` folder, or the base model) and sends
each request to one sampler actor of its runtime's :class:`~.pool.SamplerPool`; the futures
are the in-process ones (``.result()``, ``await``)::

    sampler = base_sampler(runtime, "tiny-random", None)
    sampler.sample(types.ModelInput.from_ints([1, 2]), 2, types.SamplingParams(max_tokens=4)).result()
"""

from __future__ import annotations

import secrets
import uuid
from collections.abc import Sequence
from typing import Any

from tinker import types
from tinker.lib.public_interfaces.api_future import AwaitableConcurrentFuture

from trinity_like.client.ray.actors import WeightsRef
from trinity_like.client.ray.pool import SamplerPool
from trinity_like.client.ray.runtime import RayRuntime
from trinity_like.client.sampling import check_sample_options
from trinity_like.errors import TrinityError
from trinity_like.models.resolve import load_tokenizer, resolve_model_path


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
        check_sample_options(
            include_prompt_logprobs,
            prompt_logprobs_last_n,
            topk_prompt_logprobs=topk_prompt_logprobs,
            topk_sample_logprobs=topk_sample_logprobs,
            target_prompt_logprobs=target_prompt_logprobs,
            prompt_alt_tokens_k=prompt_alt_tokens_k,
        )
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


def base_sampler(runtime: RayRuntime, base_model: str, model_path: str | None) -> RaySamplingClient:
    """A sampler over ``base_model``'s own weights or a ``save_weights_for_sampler`` folder."""
    key = f"folder:{model_path}:{uuid.uuid4().hex}" if model_path else f"base:{base_model}"
    return RaySamplingClient(runtime, WeightsRef(key, base_model, model_path=model_path))
