"""How many operations one decode step dispatches: the number a captured graph replays.

Why count: inside a CUDA graph the host is gone, but each operation is still a kernel with
a launch floor of a few microseconds; a step of ~1,300 tiny kernels costs milliseconds
however small the batch. The count does not depend on the device's speed, so the CPU can
measure it and a test can hold it down (tests/explorer/test_step_ops.py); the GPU check
prints it beside its timings.

What is counted: the aten operations (after autograd, as a ``TorchDispatchMode`` sees them)
of one *warm* :func:`~.decode_step.decode_step` -- the engine's own step over a real
:class:`~.kv_cache.SlotCache` and :class:`~.decode_step.SlotState`, sampling, stop detection
and bookkeeping included -- on the model's device, with the engine's attention::

    ops = count_decode_step_ops(model, rows=64, key_length=256)
    ops["total"], ops["kernels"], ops["by_op"]["aten.mm.default"]

:func:`smollm2_135m_shape` is a random model of SmolLM2-135M's shape (30 layers; no weights).
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from trinity_like.explorer.decode_step import SlotState, StepSettings, decode_step
from trinity_like.explorer.engine_contract import SamplingParams
from trinity_like.explorer.kv_cache import SlotCache, use_attention

if TYPE_CHECKING:  # transformers' model layer costs ~1.6 s to import: only when a model runs
    from transformers import PreTrainedModel


DEFAULT_SAMPLING = SamplingParams()  # frozen: one shared default


_NO_KERNEL = (
    torch.ops.aten._unsafe_view.default,
    torch.ops.aten.empty.memory_format,
    torch.ops.aten.empty_strided.default,
)


class _Count(TorchDispatchMode):
    """Every aten operation dispatched; apart, those that launch no kernel: the views (an output
    that aliases an input without writing it, and ``_unsafe_view``) and uninitialised allocations."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: Counter[str] = Counter()
        self.views = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops[str(func)] += 1
        returns = func._schema.returns
        alias = returns[0].alias_info if returns else None
        if (alias is not None and not alias.is_write) or func in _NO_KERNEL:
            self.views += 1
        return func(*args, **(kwargs or {}))


def count_decode_step_ops(
    model: PreTrainedModel,
    *,
    rows: int,
    key_length: int,
    sampling: SamplingParams = DEFAULT_SAMPLING,
) -> dict:
    """``{"total": n, "kernels": k, "by_op": {aten op name: count}}`` for one warm decode step of
    ``rows`` rows whose keys reach ``key_length`` (each row writes its new key at column
    ``key_length - 1``). ``total`` counts every aten operation, ``kernels`` those that are neither
    views nor ``empty`` allocations.

    The step runs under ``no_grad`` rather than the engine's ``inference_mode``: the same
    kernels run, but composite operations (``linear``, ``matmul``, ``rms_norm`` on the CPU)
    reach the counter decomposed into them instead of as one name each.

    ``sampling``: the step's settings (default: temperature 1, no top-k/top-p -- the recipes'
    default sampling path). The step runs twice; the second one is counted.
    """
    if key_length < 2:
        raise ValueError(f"key_length must be >= 2 (a cached key and the new one), got {key_length}")
    config = model.config
    device = next(model.parameters()).device
    heads = config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    max_new = sampling.max_new_tokens + 2  # two steps from an empty response never reach the cap
    cache = SlotCache(
        num_layers=config.num_hidden_layers,
        num_slots=rows,
        num_kv_heads=kv_heads,
        max_length=key_length + 1,
        head_dim=head_dim,
        dtype=model.dtype,
        device=device,
    )
    state = SlotState(rows, max_new, key_length + 1, device)
    eos = getattr(config, "eos_token_id", None)
    stop = frozenset([eos] if isinstance(eos, int) else (eos or [0]))
    settings = StepSettings.of(sampling, stop)
    stop_ids = state.stop_tensor(settings)
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad(), use_attention(model):
            state.admit(list(range(rows)), [key_length - 2] * rows, list(range(rows)))
            decode_step(model, cache, state, rows, key_length, settings, stop_ids)  # warm: first-call work
            state.pos_S[:rows] = key_length - 1
            state.live_S[:rows] = True
            counter = _Count()
            with counter:
                decode_step(model, cache, state, rows, key_length, settings, stop_ids)
    finally:
        model.train(was_training)
    total = sum(counter.ops.values())
    return {"total": total, "kernels": total - counter.views, "by_op": dict(counter.ops.most_common())}


def smollm2_135m_shape(*, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu") -> PreTrainedModel:
    """A randomly initialised model of SmolLM2-135M's sizes (30 layers, 9 heads over 3 kv heads)."""
    from trinity_like.models.shapes import shaped_model

    return shaped_model("smollm2-135m", device=device, dtype=dtype)
