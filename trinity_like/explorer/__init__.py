"""The explorer: turns tasks into scored experiences with the rollout engine.

- :mod:`.engine_contract` -- the :class:`RolloutEngine` protocol every rollout engine
  implements, what a call takes and returns (:class:`SamplingParams`, :class:`Request`,
  :class:`Sample`), the :func:`~.engine_contract.generate` helper over an engine's ``run``;
  :mod:`.engines` -- the ``ROLLOUT_ENGINE`` factory (``explorer.engine``).
- :mod:`.engine` -- :class:`NativeEngine` (``native``), ours: batched KV-cache decoding with
  shared-prefix groups and continuous batching; the decode loop of one call in :mod:`.decode`,
  its device half (state, sampling, CUDA graphs) in :mod:`.decode_step` (:mod:`.kv_cache`,
  :mod:`.prefix_cache`, :mod:`.sampling`).
- :mod:`.worker` -- where the explorer runs: :class:`ExplorerWorker` in-process or
  :class:`RemoteExplorer` as a Ray actor, one :class:`Explorer` protocol (``run``,
  ``receive_weights``), built from :class:`~.worker.ExplorerParams` (a recipe's are made in
  :mod:`trinity_like.config.engine_params`, with its sampling per step: the explorer never reads
  the recipe).
- :mod:`.workflows` -- the WORKFLOW registry's built-ins (``math``).
- :mod:`.rewards` -- the REWARD_FN registry's built-ins and safe calling (time limits, retries).
- :mod:`.tasks` -- the built-in task sources: the seeded arithmetic generator and the reasoning-gym adapter.
"""

__all__ = ["Borrowed", "EngineParams", "NativeEngine", "Request", "RolloutEngine", "Sample", "SamplingParams"]


def __getattr__(name: str) -> object:
    # The engine imports transformers (seconds): loaded when first used, not when a
    # registry only needs the workflow and reward names (`trinity-like list`, validate).
    if name in __all__:
        from trinity_like.explorer import engine

        return getattr(engine, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
