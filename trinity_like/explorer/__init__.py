"""The explorer: turns tasks into scored experiences with the rollout engine.

- :mod:`.engine` -- :class:`RolloutEngine`, :class:`SamplingParams`: batched KV-cache decoding
  with shared-prefix groups and continuous batching (:mod:`.kv_cache`, :mod:`.sampling`).
- :mod:`.workflows` -- the WORKFLOW registry's built-ins (``math``).
- :mod:`.rewards` -- the REWARD_FN registry's built-ins and safe calling (time limits, retries).
- :mod:`.tasks` -- the seeded arithmetic generator and the reasoning-gym adapter.
"""

from trinity_like.explorer.engine import EngineParams, Request, RolloutEngine, Sample, SamplingParams

__all__ = ["EngineParams", "Request", "RolloutEngine", "Sample", "SamplingParams"]
