"""The Tinker SDK's deprecated ``*_async`` spellings of a training client's methods.

The SDK kept ``await client.forward_backward_async(...)`` beside ``forward_backward(...)``;
both return the same future. In-process (:class:`~.training.TrainingClient`) and on Ray
(:class:`~.ray.clients.RayTrainingClient`) the spellings are the same few lines, so they
live here once: a mixin whose methods call the class's own.
"""

from __future__ import annotations

from typing import Any


class TrainingAsyncSpellings:
    """``<method>_async`` for each training-client method: the same future, awaited once."""

    async def forward_async(self, *args: Any, **kwargs: Any):
        return self.forward(*args, **kwargs)

    async def forward_backward_async(self, *args: Any, **kwargs: Any):
        return self.forward_backward(*args, **kwargs)

    async def forward_backward_custom_async(self, *args: Any, **kwargs: Any):
        return self.forward_backward_custom(*args, **kwargs)

    async def optim_step_async(self, *args: Any, **kwargs: Any):
        return self.optim_step(*args, **kwargs)

    async def save_state_async(self, *args: Any, **kwargs: Any):
        return self.save_state(*args, **kwargs)

    async def load_state_async(self, path: str):
        return self.load_state(path)

    async def load_state_with_optimizer_async(self, path: str):
        return self.load_state_with_optimizer(path)

    async def save_weights_for_sampler_async(self, *args: Any, **kwargs: Any):
        return self.save_weights_for_sampler(*args, **kwargs)

    async def save_weights_and_get_sampling_client_async(self, *args: Any, **kwargs: Any):
        return self.save_weights_and_get_sampling_client(*args, **kwargs)

    async def get_info_async(self):
        return self.get_info()
