"""The conversions between our padded batches and verl's padding-free TensorDicts, in-process.

Oracle: the padded-layout rule itself -- response token j of row b is scored at column
P + j - 1 of the padded sequence -- checked on outputs that encode their own position.
"""

from __future__ import annotations

import pytest
import torch
from trainer_batches import make_batch, nll_loss

from trinity_like.errors import TrinityError
from trinity_like.trainer.base import with_normalisers
from trinity_like.trainer.verl_engine import split_over_workers
from trinity_like.trainer.verl_worker import (
    VerlLossAdapter,
    from_verl,
    largest_divisor_at_most,
    model_outputs_to_padded,
    to_verl,
)
from verl.utils import tensordict_utils as tu

B, P, R = 6, 5, 4


def position_codes(batch) -> tuple[torch.Tensor, torch.Tensor]:
    """Per real token, in verl's packed order, the code 100 * row + padded column; and the padded codes."""
    rows, cols = torch.meshgrid(torch.arange(B), torch.arange(P + R), indexing="ij")
    codes_BT = (100 * rows + cols).float()
    return codes_BT[batch["attention_mask"].bool()], codes_BT


@pytest.mark.parametrize("kind", ["lm", "value"])
def test_padding_free_outputs_come_back_at_the_padded_positions(kind):
    batch = with_normalisers(make_batch(50, B, P, R, seed=2))
    td = to_verl(batch, micro_batch_size=4, need_entropy=False, kind=kind)
    packed, codes_BT = position_codes(batch)
    nested = torch.nested.nested_tensor_from_jagged(packed, td["input_ids"].offsets())
    key = "log_probs" if kind == "lm" else "values"
    out = model_outputs_to_padded({key: nested}, td)
    expected_BR = codes_BT[:, P - 1 : P + R - 1]
    attended = batch["attention_mask"][:, P:].bool()
    got = out["logprob" if kind == "lm" else "values"]
    assert torch.equal(got[attended], expected_BR[attended])


def test_reward_scores_are_read_at_the_last_real_token():
    batch = make_batch(50, B, P, R, seed=3)
    td = to_verl(batch, micro_batch_size=4, need_entropy=False, kind="reward")
    packed, codes_BT = position_codes(batch)
    nested = torch.nested.nested_tensor_from_jagged(packed, td["input_ids"].offsets())
    last = [int(torch.nonzero(batch["attention_mask"][b]).max()) for b in range(B)]
    expected = torch.stack([codes_BT[b, last[b]] for b in range(B)])
    assert torch.equal(model_outputs_to_padded({"values": nested}, td)["scores"], expected)


def test_loss_adapter_sees_our_batch_and_scales_by_the_data_parallel_size():
    batch = with_normalisers(make_batch(50, B, P, R, seed=4))
    td = to_verl(batch, micro_batch_size=4, need_entropy=False, kind="lm")
    tu.assign_non_tensor(td, dp_size=3)
    ours = from_verl(td)
    for key in ("response_mask", "old_logprob", "advantages", "attention_mask"):
        assert torch.equal(ours[key], batch[key])
    assert float(ours["num_tokens"]) == float(batch["response_mask"].sum())
    logprob = torch.randn(B, P + R)
    packed = logprob[batch["attention_mask"].bool()]
    nested = torch.nested.nested_tensor_from_jagged(packed, td["input_ids"].offsets())
    loss, _ = VerlLossAdapter(nll_loss)({"log_probs": nested}, td)
    expected, _ = nll_loss({"logprob": logprob[:, P - 1 : P + R - 1]}, batch)
    torch.testing.assert_close(loss, 3 * expected)


def test_batches_split_evenly_over_workers_padding_with_masked_rows():
    batch = with_normalisers(make_batch(50, B, P, R, seed=5))
    blocks = split_over_workers(batch, 3)
    assert [b["input_ids"].shape[0] for b in blocks] == [2, 2, 2]
    assert all(b["num_tokens"] is batch["num_tokens"] for b in blocks)  # global normalisers shared
    padded = split_over_workers(batch, 4)  # 6 rows over 4 workers: 2 masked rows appended
    assert [b["input_ids"].shape[0] for b in padded] == [2, 2, 2, 2]
    assert padded[-1]["response_mask"].sum() == 0 and padded[-1]["num_tokens"] is batch["num_tokens"]
    assert torch.equal(torch.cat([b["input_ids"] for b in padded])[:6], batch["input_ids"])
    assert [largest_divisor_at_most(n, 4) for n in (1, 6, 7, 8, 12)] == [1, 3, 1, 4, 4]


def test_pair_batches_split_only_between_pairs():
    """Preference pairs (rows 2i, 2i + 1) stay together in every shard and micro-batch."""
    batch = with_normalisers(make_batch(50, B, P, R, seed=5))  # 3 pairs
    batch["rows_per_example"] = torch.tensor(2)
    blocks = split_over_workers(batch, 2)  # 6 rows over 2 workers: 1 masked pair appended
    assert [b["input_ids"].shape[0] for b in blocks] == [4, 4]
    assert blocks[1]["response_mask"][2:].sum() == 0
    assert torch.equal(torch.cat([b["input_ids"] for b in blocks])[:6], batch["input_ids"])
    # verl's micro-batches inside a worker: a divisor of its rows, in whole pairs
    assert [largest_divisor_at_most(n, 3, 2) for n in (4, 6, 12, 2)] == [2, 2, 2, 2]
    assert [largest_divisor_at_most(n, 1, 2) for n in (4, 6)] == [2, 2]
    assert largest_divisor_at_most(12, 8, 2) == 6


def test_missing_model_fails_before_ray_starts(tmp_path):
    import ray

    from trinity_like.trainer.params import ModelParams
    from trinity_like.trainer.verl_engine import VerlEngine

    with pytest.raises(TrinityError, match="not found"):
        VerlEngine(ModelParams(path=str(tmp_path / "nope")))
    assert not ray.is_initialized()
