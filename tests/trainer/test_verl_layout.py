"""How the ``verl`` engine splits a batch over its workers, in-process (no Ray)."""

from __future__ import annotations

import pytest
import torch
from _lib.trainer_batches import make_batch

from trinity_like.errors import TrinityError
from trinity_like.trainer.base import micro_batches, with_normalisers
from trinity_like.trainer.verl_engine import split_over_workers

B, P, R = 6, 5, 4


def test_batches_split_evenly_over_workers_padding_with_masked_rows():
    batch = with_normalisers(make_batch(50, B, P, R, seed=5))
    blocks = split_over_workers(batch, 3)
    assert [b["input_ids"].shape[0] for b in blocks] == [2, 2, 2]
    assert all(b["num_tokens"] is batch["num_tokens"] for b in blocks)  # global normalisers shared
    padded = split_over_workers(batch, 4)  # 6 rows over 4 workers: 2 masked rows appended
    assert [b["input_ids"].shape[0] for b in padded] == [2, 2, 2, 2]
    assert padded[-1]["response_mask"].sum() == 0 and padded[-1]["num_tokens"] is batch["num_tokens"]
    assert torch.equal(torch.cat([b["input_ids"] for b in padded])[:6], batch["input_ids"])


def test_pair_batches_split_only_between_pairs():
    """Preference pairs (rows 2i, 2i + 1) stay together in every shard and micro-batch."""
    batch = with_normalisers(make_batch(50, B, P, R, seed=5))  # 3 pairs
    batch["rows_per_example"] = torch.tensor(2)
    blocks = split_over_workers(batch, 2)  # 6 rows over 2 workers: 1 masked pair appended
    assert [b["input_ids"].shape[0] for b in blocks] == [4, 4]
    assert blocks[1]["response_mask"][2:].sum() == 0
    assert torch.equal(torch.cat([b["input_ids"] for b in blocks])[:6], batch["input_ids"])
    # micro-batches inside a worker: whole pairs, as many on every rank (equal rows each)
    assert [b["input_ids"].shape[0] for b in micro_batches(blocks[0], 3)] == [2, 2]


def test_missing_model_fails_before_ray_starts(tmp_path):
    import ray

    from trinity_like.trainer.params import ModelParams
    from trinity_like.trainer.verl_engine import VerlEngine

    with pytest.raises(TrinityError, match="not found"):
        VerlEngine(ModelParams(path=str(tmp_path / "nope")))
    assert not ray.is_initialized()
