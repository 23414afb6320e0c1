"""The one rollout-engine factory: a recipe's ``explorer.engine`` over a model folder.

Example::

    engine = build_rollout_engine("native", "smollm2-135m-instruct")              # auto device and dtype
    engine = build_rollout_engine(config.explorer.engine, path, device="cuda", dtype="auto",
                                  params=EngineParams(prefix_cache_tokens=0))

Every engine is an entry of the ``ROLLOUT_ENGINE`` registry: a callable that takes an
:class:`~trinity_like.explorer.engine_contract.EngineSpec` (model folder, device, dtype,
capacity) and returns a :class:`~trinity_like.explorer.engine_contract.RolloutEngine`.
``native`` is ours (:class:`~trinity_like.explorer.engine.NativeEngine`); a plugin registers
another the same way (``plugins/README.md``, ``docs/gpu.md``: a vLLM engine on a GPU
machine, or the example plugin's ``hf_generate``). This module imports no model code: the
registry entry loads it when an engine is built, so ``trinity-like list`` stays fast.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from trinity_like.explorer.engine_contract import EngineParams, EngineSpec, RolloutEngine
from trinity_like.models.device import resolve_device, rollout_dtype
from trinity_like.models.resolve import resolve_model_path
from trinity_like.registry import ROLLOUT_ENGINE

if TYPE_CHECKING:
    import torch

DEFAULT_PARAMS = EngineParams()


def build_rollout_engine(
    name: str,
    model: str | os.PathLike[str],
    *,
    device: str | torch.device | None = None,
    dtype: str | torch.dtype = "auto",
    params: EngineParams = DEFAULT_PARAMS,
) -> RolloutEngine:
    """The ``ROLLOUT_ENGINE`` entry ``name`` over ``model`` (a folder or built-in id).

    ``device``: a spec (``auto``, ``cpu``, ``cuda:1``), a torch device, or None (this process's
    run device, :func:`~trinity_like.models.device.run_device`); ``dtype``: ``auto`` (the
    device's rollout precision), ``float32``, ``bfloat16`` or a torch dtype.
    """
    import torch

    factory = ROLLOUT_ENGINE.get(name)  # an unknown name fails first, listing the known ones
    where = resolve_device(None if device is None else str(device), where="explorer device")
    kind = dtype if isinstance(dtype, torch.dtype) else rollout_dtype(str(dtype), where)
    engine = factory(EngineSpec(resolve_model_path(model), where, kind, params))
    if not isinstance(engine, RolloutEngine):
        raise TypeError(
            f"rollout engine {name!r} built a {type(engine).__name__}, which lacks the RolloutEngine methods"
        )
    return engine


@ROLLOUT_ENGINE.register_module("native")
def native_engine(spec: EngineSpec) -> RolloutEngine:
    """Ours: batched KV-cache decoding, prompts prefilled once per group, continuous batching, CUDA graphs on a GPU."""
    from trinity_like.explorer.engine import NativeEngine
    from trinity_like.models.resolve import load_model

    model, tokenizer = load_model(spec.model_path, dtype=spec.dtype)
    return NativeEngine(model.to(spec.device), tokenizer, spec.params)
