"""The Tinker-compatible client on Ray: ``ServiceClient(backend="ray", ray=RayClientConfig(...))``.

One learner actor per training client and a pool of sampler actors, placed in one
placement group; the clients have the in-process API and wrap Ray object references in
the same futures. See docs/client.md ("Running on Ray").

- :mod:`.config`: :class:`RayClientConfig` (bundles, strategy, backpressure, restarts).
- :mod:`.actors`: :class:`LearnerActor`, :class:`SamplerActor` (the in-process clients inside).
- :mod:`.pool`: the controller's dispatch, backpressure, sampler restarts and retries.
- :mod:`.runtime`: :class:`RayRuntime` (Ray, the placement group, the sampler pool).
- :mod:`.clients`: :class:`RayTrainingClient` (the learner's client).
- :mod:`.sampling`: :class:`RaySamplingClient` (the samplers' client).
"""

from __future__ import annotations

from trinity_like.client.futures import wait_all
from trinity_like.client.ray.actors import LearnerActor, SamplerActor
from trinity_like.client.ray.clients import RayTrainingClient
from trinity_like.client.ray.config import Bundle, RayClientConfig
from trinity_like.client.ray.runtime import RayRuntime
from trinity_like.client.ray.sampling import RaySamplingClient

__all__ = [
    "Bundle",
    "LearnerActor",
    "RayClientConfig",
    "RayRuntime",
    "RaySamplingClient",
    "RayTrainingClient",
    "SamplerActor",
    "wait_all",
]
