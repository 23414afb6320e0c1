"""pack() reads a device batch back once, not row by row (trainer/forward.py).

On a GPU every operation whose result the host reads (``nonzero``, ``tolist``) waits for the device;
the old pack ran three per row. Counted here as the operations that touch the batch's own tensors:
a fixed handful whatever the number of rows. The packing itself is held to the padded layout by
tests/trainer/test_shared_prompt.py.
"""

from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from trinity_like.trainer.forward import pack


class _OpsOn(TorchDispatchMode):
    def __init__(self, tensors: list[torch.Tensor]) -> None:
        super().__init__()
        self.ptrs = {t.untyped_storage().data_ptr() for t in tensors}
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        flat = [a for a in args if isinstance(a, torch.Tensor)]
        if any(a.untyped_storage().data_ptr() in self.ptrs for a in flat):
            self.count += 1
        return func(*args, **(kwargs or {}))


def batch(rows: int, prompt: int = 6, response: int = 5) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(rows)
    ids = torch.randint(1, 50, (rows, prompt + response), generator=gen)
    ids[1::2, :prompt] = ids[0::2, :prompt][: rows // 2]  # pairs share a prompt
    attention = torch.ones(rows, prompt + response, dtype=torch.long)
    attention[:, :2] = 0  # left padding
    attention[::3, -2:] = 0  # some responses end early
    return {
        "input_ids": ids,
        "attention_mask": attention,
        "position_ids": (attention.cumsum(1) - 1).clamp(min=0),
        "response_mask": attention[:, prompt:],
    }


def ops_on_batch(rows: int) -> int:
    b = batch(rows)
    mode = _OpsOn([b["input_ids"], b["attention_mask"], b["position_ids"]])
    with mode:
        packed = pack(b)
    assert packed is not None and packed.source.shape[0] == rows
    return mode.count


def test_pack_reads_the_batch_a_fixed_number_of_times_whatever_its_rows():
    assert ops_on_batch(4) == ops_on_batch(32) <= 6
